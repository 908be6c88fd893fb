"""Helpers shared by test modules (real servers, fixtures)."""
