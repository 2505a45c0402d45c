"""`trainer tune AGENT`: a hyperparameter search whose answer holds on fresh seeds and on the part held out
(study.py: the search and its re-runs; space.py: what is searched; trial.py: one trial; report.py: the answer)."""
