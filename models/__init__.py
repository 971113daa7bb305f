"""Reference cluster models: small readable examples (models/examples) and seeded benchmark instance generators
(models.generators), importable after `pip install -e .` (`kai-opt bench run` uses them)."""
