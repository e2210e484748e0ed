"""Receiver-relative bounded coordination (ALGORITHMS.md §D): its simulator and its selector."""
