"""The smoke-test training loop behind ``invoke verify``.

Parent side (no torch): ``data`` (staged-data validation, the datasets, the batch order), ``launch`` (the child
process, its events, timeout and Ctrl-C), ``figures`` (step breakdown from the child's records). Child side (torch,
run by ``checks/verify/scripts/smoke_train.py``): ``child`` (the phases), ``loop`` (timed steps), ``models``, ``ckpt``
(checkpoint round trip), ``setup`` (device, precision, the built-in or the user's data and model), ``extras``
(FLOPs, kernel statistics, OOM search, batch sweep, compile A/B).
"""
