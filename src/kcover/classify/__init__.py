"""Classification: the fault catalog (data), the matcher, and root-cause attribution.

``rules`` loads and validates the YAML catalog, ``engine`` finds candidate lines
fast, ``matcher`` confirms them, ``collector`` deduplicates them into faults and
``attribution`` turns the faults of a job into a verdict.
"""
