"""The configuration: YAML read under bounds, parsed into frozen dataclasses
(model.py), checked, viewed and described (schema.py); default.yaml is the
embedded default.
"""
