"""How a run is judged and told: evaluation episodes and metrics, the report and its plots."""
