"""Reports for the people who plan budgets and purchases: figures over weeks, read from Prometheus."""
