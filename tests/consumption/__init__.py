"""Consumption tests: query pack, ARM templates, dashboards, alert rules, deployment configs."""
