"""Suite settings: declared by each case, given as ``MLSCALE_*`` variables or ``--set NAME=VALUE``.

A case declares its settings once, as ``Setting(name, kind, default, allowed, help)``
entries of its ``declared_settings``; `resolve` reads the ones of the suite being
run (``--set`` before the environment), parses them with their kind (a malformed
value is a one-line `InputError` naming the variable) and hands the case a
`Settings` mapping, name -> value. ``--set DP_MODEL=cnn`` means
``MLSCALE_DP_MODEL=cnn`` for this command only; nothing is written to
``os.environ``. An unknown ``--set`` name is an `InputError`; an ``MLSCALE_*``
variable that carries one of the suite's prefixes but is not one of its settings
is a warning (a typo would otherwise measure the default silently). Variables of
other suites are not read at all.

The ``settings`` CSV column (part of a point's key) holds the suite's own
settings whose value differs from the default, in canonical form, as sorted
JSON of ``{"MLSCALE_NAME": "text"}``: points measured with the defaults keep the
key ``{}`` they always had, and a variable of another suite left in the shell
no longer changes the key.
"""
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from bench.units import parse_size
from kernels.errors import InputError

PREFIX = "MLSCALE_"

#: Variables that steer the harness itself rather than what a suite computes.
HARNESS_VARIABLES = ("MLSCALE_MPIEXEC", "MLSCALE_DEBUG", "MLSCALE_CUDA_AWARE", "MLSCALE_GRACE_SECONDS",
                     "MLSCALE_MAX_POINT_SECONDS", "MLSCALE_MEMORY_PROBE")
#: The first word of the settings of every registered suite (``DP`` of ``MLSCALE_DP_MODEL``; ``GRID`` is a
#: whole name): another suite's variable is not read, a name under none of them is a typo (tests check the list).
SUITE_PREFIXES = ("ATTN", "COLL", "CONV", "DP", "GEMM", "GRID", "HYBRID", "MOE", "PP", "PS", "SVM", "TP")


def choice(variable, text, allowed):
    """``text`` lower-cased, one of the names ``allowed``."""
    value = text.lower()
    if value not in allowed:
        raise InputError(f"{variable}={value!r}: choose from {', '.join(allowed)}")
    return value


def _bounded(variable, text, convert, valid, expected):
    """``convert(text)`` when ``valid`` of it, else an `InputError` saying what was ``expected``."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise InputError(f"{variable}={text!r}: expected {expected}")
    return value


def integer(variable, text, allowed):
    """An integer of at least ``allowed`` (the minimum)."""
    return _bounded(variable, text, int, lambda value: value >= allowed, f"an integer >= {allowed}")


def number(variable, text, allowed):
    """A float greater than ``allowed`` (NaN is refused)."""
    return _bounded(variable, text, float, lambda value: value > allowed, f"a number > {allowed}")


def byte_size(variable, text, allowed):
    """A byte count with an optional K/M/G suffix (powers of 1024)."""
    try:
        return parse_size(text)
    except InputError as error:
        raise InputError(f"{variable}: {error}") from None


def flag(variable, text, allowed):
    """A boolean written 0/1 (also false/true, no/yes, off/on)."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise InputError(f"{variable}={value!r}: expected 0 or 1")


def string(variable, value, allowed):
    """The text as given (stripped); the case checks it."""
    return value


_ALLOWED = {choice: lambda allowed: "|".join(allowed), integer: lambda allowed: f"integer >= {allowed}",
            number: lambda allowed: f"number > {allowed}", byte_size: lambda allowed: "bytes, K/M/G suffix",
            flag: lambda allowed: "0|1"}


@dataclass(frozen=True)
class Setting:
    """One declared setting of a suite.

    Parameters
    ----------
    name : str
        Without the prefix: ``DP_MODEL`` is given as ``MLSCALE_DP_MODEL`` or ``--set DP_MODEL=...``.
    kind : callable
        ``kind(variable, text, allowed) -> value``, raising `InputError` for bad text:
        `choice`, `integer`, `number`, `byte_size`, `flag`, `string`, or a parser of the case.
    default : object
        The value when the setting is not given; None where the case derives it
        (``help`` says how).
    allowed : object
        The choices (`choice`), the minimum (`integer`, `number`), or for other kinds
        a description of what is accepted, shown by ``mlscale list SUITE``.
    help : str
        One line for ``mlscale list SUITE``.
    """

    name: str
    kind: Callable
    default: object
    allowed: object = None
    help: str = ""

    @property
    def variable(self):
        return PREFIX + self.name

    def parse(self, value):
        return self.kind(self.variable, value.strip(), self.allowed)

    def describe_allowed(self):
        """What values are accepted, as a short text."""
        shown = _ALLOWED.get(self.kind)
        return shown(self.allowed) if shown else str(self.allowed or "")


def canonical(value):
    """The text that records ``value`` in the CSV (flags 0/1, grids ``2x1``)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return str(value)


class Settings(Mapping):
    """The resolved settings of one suite: declared name -> value.

    ``changed`` holds the canonical text of the values that differ from their
    default; ``warnings`` the lines about variables that look like the suite's
    but are not declared.
    """

    def __init__(self, values=None, changed=None, warnings=()):
        self._values = dict(values or {})
        self.changed = dict(changed or {})
        self.warnings = list(warnings)

    def __getitem__(self, name):
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def column(self):
        """The ``settings`` CSV column: sorted JSON of the non-default settings by variable name."""
        return json.dumps({PREFIX + name: value for name, value in sorted(self.changed.items())})

    def assignments(self):
        """``NAME=VALUE`` words that give these settings again (``--set``)."""
        return [f"{name}={value}" for name, value in sorted(self.changed.items())]


def _suggestion(name, names):
    """``; did you mean X?`` for the closest of ``names`` to ``name``, compared without ``MLSCALE_``."""
    def bare(text):
        return text[len(PREFIX):] if text.startswith(PREFIX) else text

    by_bare = {bare(other): other for other in names}
    close = difflib.get_close_matches(bare(name), list(by_bare), n=1)
    return f"; did you mean {by_bare[close[0]]}?" if close else ""


def _parse_assignments(assignments, declared, suite):
    """``{NAME: text}`` from ``--set`` words; `InputError` for malformed words and undeclared names."""
    names = [setting.name for setting in declared]
    given = {}
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        name = name.strip().upper()
        if not sep or not name.replace("_", "").isalnum():
            raise InputError(f"--set {assignment!r}: expected NAME=VALUE, e.g. --set DP_MODEL=cnn")
        name = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if name not in names:
            known = f"its settings are {', '.join(names)}" if names else "it has no settings"
            raise InputError(f"--set {name}: not a setting of suite {suite!r} ({known}){_suggestion(name, names)}")
        given[name] = value
    return given


def _stray_variables(declared, environ, suite):
    """Warnings for ``MLSCALE_<PREFIX>_*`` variables of this suite's prefixes that it does not declare, for
    ``MLSCALE_*`` names under no suite's prefix nor the harness's, and for a harness value it cannot use."""
    variables = [setting.variable for setting in declared]
    prefixes = {PREFIX + setting.name.split("_")[0] + "_" for setting in declared if "_" in setting.name}
    words = set(SUITE_PREFIXES) | {setting.name.split("_")[0] for setting in declared}
    known = sorted(set(variables) | set(HARNESS_VARIABLES) | {PREFIX + word for word in words})
    warnings = []
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in variables or name in HARNESS_VARIABLES:
            continue
        if any(name.startswith(prefix) for prefix in prefixes):
            warnings.append(f"{name} is not a setting of suite {suite!r}: ignored{_suggestion(name, variables)}")
        elif name[len(PREFIX):].split("_")[0] not in words:
            warnings.append(f"{name} is not a variable of mlscale: ignored{_suggestion(name, known)}")
    return warnings + _harness_problems(environ)


def _harness_problems(environ):
    """Warnings for harness variables whose value cannot be used."""
    from bench.faults import AGREE_GRACE_SECONDS, GRACE_VARIABLE, grace_seconds

    text = environ.get(GRACE_VARIABLE)
    if text is None or grace_seconds(text) is not None:
        return []
    return [f"{GRACE_VARIABLE}={text!r}: expected a positive number of seconds; {AGREE_GRACE_SECONDS:g} used"]


def resolve(declared, assignments=(), environ=None, suite=""):
    """The `Settings` of a suite that declares ``declared`` (a sequence of `Setting`).

    Parameters
    ----------
    declared : sequence of Setting
    assignments : sequence of str
        ``NAME=VALUE`` words of ``--set`` (the name with or without ``MLSCALE_``,
        any case); they take precedence over ``environ``.
    environ : mapping, optional
        The environment to read ``MLSCALE_*`` variables from (default: none).
    suite : str
        The suite's name, for messages.

    Raises
    ------
    InputError
        For a malformed or undeclared ``--set`` word, or a malformed value.
    """
    environ = environ or {}
    given = _parse_assignments(assignments, declared, suite)
    values, changed = {}, {}
    for setting in declared:
        raw = given.get(setting.name, environ.get(setting.variable))
        value = setting.default if raw is None else setting.parse(raw)
        values[setting.name] = value
        if value != setting.default:
            changed[setting.name] = canonical(value)
    return Settings(values, changed, _stray_variables(declared, environ, suite))
