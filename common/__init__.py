"""What every layer of the testbed shares, beneath them all: the errors a user can cause
(:mod:`common.errors`) and the validated-spec base class with its YAML loading
(:mod:`common.validation`). It imports no other package of the project."""
