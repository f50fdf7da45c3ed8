"""The former name of ``planted_plugins.py``: what still plants through ``tests.checks.verify.smoke_plugins:NAME``
(or imports from here) finds the same factories and classes until it moves to the new name."""

from tests.checks.verify.planted_plugins import *  # noqa: F403
