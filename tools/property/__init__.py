"""The property suites' internals: random networks and the invariants they must hold.

  networks, invariants                     -> the rewrite suite
                                              (tests/property_test.py)
  converter_networks, converter_invariants -> the converter suite, TFLite's
                                              converter in the loop
                                              (tests/converter_property_test.py)
  check                                    -> the command line: any number of
                                              examples of either suite

`.venv/bin/python tools/property/check.py --examples=10000 --seed=0`;
docs/architecture.md#property-based-checks describes both suites.
"""
