"""JSON Schemas of the wire contract and the configuration (package data: ``*.schema.json``)."""
