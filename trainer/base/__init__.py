"""The ground every other part stands on: errors, atomic files, durations, logs, progress, stop signals, a check's
result. It imports nothing else of the product."""
