"""Reference tables: facts about hardware and builds that no machine reports, read by every task that judges one.

``datasheet`` (the GPU datasheet table of ``templates/gpus.yaml``: expected figures per card, the form factor) and
``torchbuilds`` (torch's CUDA builds, their drivers and arch lists). Pure lookups over the core's records, no I/O
but the table file: bootstrap's checks, ``plan``, ``diff``/``lock`` and verify read the same rows, so the tables
live below all of them instead of inside one task's package.
"""
