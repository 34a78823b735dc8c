"""The e2e tier is a package so its `local_default` (package scope) ends with the tier: its operator
and pod runner never run on during the integration tier."""
