"""The typed records of what a task's report holds, for the readers on other floors: ``bootstrap`` (bootstrap's
``measurements``, which its writer in ``checks.machine`` shares with ``invoke diff``, the fleet and provision) and
``verify`` (verify's ``measurements``, which its writers in ``checks.verify`` and ``plan --from`` share). Standard
library and the core only: verify's training child imports them."""
