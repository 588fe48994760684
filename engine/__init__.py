"""Myriad's pure core: plain Python and NumPy, no Django, Celery or Channels.

The same code runs in a what-if simulation, the live demo and production; only the
surroundings change. A test fails if anything here imports a web or task framework.
"""
