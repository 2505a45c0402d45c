"""The typed config (one pydantic section per concern, a doc per field), its loading (defaults, profile, files, --set)
and the roster of agents."""
