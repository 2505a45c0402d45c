"""The night: baseline → rbc → optimum → each agent → report, within a budget or by a deadline.

- ``budget``: durations, deadlines and the split of the night's time between stages (pure).
- ``calibrate``: this machine's measured speeds, cached per machine and config.
- ``plan``: the night's timeline from those speeds, and what cannot fit.
- ``state``: the schedule's state machine and ``schedule.json`` (pure; any runner drives it).
- ``stages``: what one stage does: evaluate a reference, train and evaluate an agent, record results.
- ``runner``: the night in this process, the first implementation of ``StageRunner``.
- ``install``: systemd units and crontab lines that start the night every day.
"""
