"""What every layer of the testbed shares, beneath them all: the errors a user can cause
(:mod:`common.errors`), the validated-spec base class with its YAML loading
(:mod:`common.validation`) and a run's provenance: the code, software and machine it ran on
(:mod:`common.provenance`). It imports no other package of the project."""
