"""The ground floor: argument checks, lazy exports, the version, provenance and secure draws.

Every other folder may import these modules; they import nothing of the package above them.
"""
