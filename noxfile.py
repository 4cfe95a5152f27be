"""nox sessions: `nox -s tests`, `nox -s lint`, `nox -s benchmark`."""

import nox

nox.options.sessions = ["lint", "tests"]


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "-n", "2", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "pax_eqx", "experiments", "benchmarks", "tests")


@nox.session
def benchmark(session: nox.Session) -> None:
    session.install("-e", ".")
    session.run("python", "-m", "benchmarks.mfu", *(session.posargs or ["--exp", "shakespeare_char"]))
