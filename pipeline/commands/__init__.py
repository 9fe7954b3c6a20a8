"""The commands beside `build` (publish, wheel-check, reproduce, matrix): the top layer, with cli.py and handlers.py."""
