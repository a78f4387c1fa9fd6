"""diagnostics"""
