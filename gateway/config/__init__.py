"""The configuration: YAML read under bounds, parsed into frozen dataclasses
(model.py: the document; one module per section), checked, viewed and
described (schema.py); default.yaml is the embedded default.
"""
