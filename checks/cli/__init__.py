"""The CLI layer under tasks.py: the project's Invoke program, the task flags and what a task prints.

The only package of ``checks/`` that imports Invoke (``tests/test_architecture.py`` holds that): ``program`` (the
project's ``invoke.Program``: flag and configuration mistakes as one line, exit 2; ``PreflightError`` to exit
codes), ``flags`` (how a dataclass field becomes a task flag), ``taskflags`` (every task's flags, one dataclass
each) and ``terminal`` (a report's text and JSON, progress lines, the exit code). Only tasks.py and the tests
import it; the core below it raises plain exceptions and never prints.
"""
