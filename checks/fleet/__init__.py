"""Several hosts: the fleet report (one row per host and the links between them) and its rendering."""
