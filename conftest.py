# Loads the conformance plugin for runs from the repository root:
#   pytest --backend=openreg            (the conformance suite, see pyproject testpaths)
# The plugin is inert without --backend, so the project's own tests are unaffected.
pytest_plugins = ["privateuse1_conformance.harness.plugin"]
