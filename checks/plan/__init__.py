"""``invoke plan``: which card, how many, and what an epoch costs, for one model.

``request`` (the task's record), ``model`` (the model's sizes: measured in a child on the meta device, from a
Hugging Face config.json, or analytic), ``memory`` (the per-GPU terms), ``cards`` (each card class of
templates/gpus.yaml: fits, largest micro-batch, smallest N and sharding), ``timing`` (step time and cost per
card from a verify report), ``render`` and ``run`` (what the task calls). The tool process never imports torch:
``scripts/measure_model.py`` runs in a child through ``checks.probe.torch.run_child``.
"""
