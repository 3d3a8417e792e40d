"""Example handlers: ``echo`` (the smallest handler) and ``resumes`` (a two-gate pipeline)."""
