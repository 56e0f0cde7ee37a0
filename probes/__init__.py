"""The probe catalogue, installed as ``tangentlens.probes``."""
