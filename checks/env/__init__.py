"""The software environment across boxes: ``invoke diff`` (what differs, ranked by what can break training),
``invoke lock`` (pins that reproduce this environment) and bootstrap's ``env-lock`` check."""
