"""Stubs generated from protos/hetcluster/v1."""
