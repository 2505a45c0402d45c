"""CityLearn as the agents see it: environments, the multi-objective reward and the EV guard."""
