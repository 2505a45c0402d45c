"""pvbess-trainer: overnight RL training for PV + battery + EV sites on CityLearn."""

__version__ = "0.1.0"
