"""The night: baseline → rbc → optimum → each agent → report, within a budget or by a deadline.

- ``budget``: the split of the night's time between stages (pure).
- ``calibrate``: this machine's measured speeds, cached per machine and config.
- ``plan``: the night's timeline from those speeds, and what cannot fit.
- ``state``: the schedule's state machine, ``schedule.json`` and its driver, the one owner of a stage's life.
- ``stages``: what one stage does: evaluate a reference, train and evaluate an agent, record results.
- ``backends``: where the stages run, one table: this process one after another, or Ray (``ray_runner``).
- ``runner``: a night prepared and driven on a backend; ``sweep``: several nights (seeds) on one.
- ``install``: systemd units and crontab lines that start the night every day.
"""
