"""verify and watch: the run plan, the smoke loop (a child process), sampler, diagnosis, plot and cost."""
