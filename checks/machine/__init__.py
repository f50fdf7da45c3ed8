"""Bootstrap's rules: one module per subject, each a judgment over the probe's facts, and the runner."""
