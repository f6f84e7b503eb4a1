"""The methods hdeval hosts: each package under here is one method behind the seam in
:mod:`hdeval.methods.base`; :mod:`hdeval.methods.registry` finds them and loads artifacts."""
