"""What every agent is judged against: the uncontrolled site, the rule-based controller, the perfect-foresight optimum
and the day-ahead planner, one row each in its roster."""
