"""The stages of a build, in order: load (loader), doctor, export, compile, verify, package; and
publish, which uploads what a build packaged. build.py calls them top to bottom."""
