"""Every option of every command, its value taken from a flag, the environment or a file.

One helper, :func:`option`, builds them all, so that each reads the same kind of
variables, shows its default and variables in ``--help``, and is validated the same
way wherever its value came from. A value is looked for in this order:

1. the flag;
2. ``TABLECAST_<COMMAND>_<OPTION>`` (the ``kafka`` command also reads
   ``TABLECAST_KAFKA_<ACTION>_<OPTION>`` first: ``TABLECAST_KAFKA_START_PORT``);
3. the shared variable, for the four options that mean the same in every command
   that has them (:data:`SHARED`);
4. ``serve --config FILE`` (TOML or YAML, keys named as the long options);
5. the default.

An empty variable counts as unset. Switches read 1/true/yes/on and 0/false/no/off.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tablecast.cli.errors import UsageError

PREFIX = "TABLECAST_"

#: options whose one variable serves every command that has them. --port is the HTTP
#: port (of serve, and of the first node of dev and demo), never the broker's: the
#: kafka command shares nothing
SHARED = {
    "--bootstrap-servers": "TABLECAST_BOOTSTRAP_SERVERS",
    "--kafka-config": "TABLECAST_KAFKA_CONFIG",
    "--cluster-secret": "TABLECAST_CLUSTER_SECRET",
    "--port": "TABLECAST_PORT",
}

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

#: a check of a converted value: (the name to blame, the value) -> why it is wrong, or None
Check = Callable[[str, Any], "str | None"]


def between(low: int, high: int) -> Check:
    def check(name: str, value: Any) -> str | None:
        return None if low <= value <= high else f"{name}: {low} to {high}, not {value}"

    return check


def at_least(low: float) -> Check:
    def check(name: str, value: Any) -> str | None:
        return None if value >= low else f"{name} is at least {low:g}"

    return check


def positive(unit: str) -> Check:
    def check(name: str, value: Any) -> str | None:
        return None if value > 0 else f"{name} is a positive number{unit}"

    return check


PORT = between(1, 65535)


def readable(name: str, value: Any) -> str | None:
    """A file option: the file must be there and readable when the command starts."""
    try:
        with open(value, "rb"):
            return None
    except OSError as e:
        return f"{name}: cannot read {value}: {e.strerror or e}"


@dataclass(frozen=True)
class Option:
    flag: str
    dest: str
    type: Callable[[str], Any]
    default: Any
    choices: tuple[str, ...] | None
    switch: bool
    required: bool
    check: Check | None

    @property
    def key(self) -> str:
        """Its name in a variable: ``--cache-mb`` -> ``CACHE_MB``."""
        return self.flag.lstrip("-").replace("-", "_").upper()


class Parser(argparse.ArgumentParser):
    """An argument parser that raises its errors (``main`` reports them as one line) and
    knows the variables of its options."""

    def __init__(
        self,
        *args: Any,
        env_prefix: str = PREFIX,
        per_action: str | None = None,
        shares: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.env_prefix = env_prefix
        #: the positional argument whose value also names variables (kafka's action)
        self.per_action = per_action
        self.shares = shares
        self.options: list[Option] = []
        self.commands: dict[str, Parser] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def variables(self, opt: Option, action: str | None = None) -> list[str]:
        """The variables `opt` reads, first found wins."""
        names = []
        if self.per_action and action:
            names.append(f"{self.env_prefix}{action.upper()}_{opt.key}")
        names.append(self.env_prefix + opt.key)
        if self.shares and opt.flag in SHARED:
            names.append(SHARED[opt.flag])
        return names

    def _shown_variables(self, opt: Option) -> str:
        names = self.variables(opt)
        if self.per_action:
            names.insert(0, f"{self.env_prefix}<ACTION>_{opt.key}")
        return " or ".join(names)


def option(
    p: Parser,
    flag: str,
    default: Any = None,
    *,
    help: str,
    type: Callable[[str], Any] = str,
    choices: Sequence[str] | None = None,
    switch: bool = False,
    required: bool = False,
    check: Check | None = None,
    shown: str | None = None,
    metavar: str | None = None,
    dest: str | None = None,
    short: str | None = None,
) -> Option:
    """Add option `flag` to `p`: its help ends with its default and its variables.

    argparse only collects what the command line gave (strings, or True for a
    switch); :func:`resolve` converts and checks every value, whatever its source.
    """
    if switch and default is None:
        default = False
    opt = Option(
        flag,
        dest or flag.lstrip("-").replace("-", "_"),
        type,
        default,
        tuple(choices) if choices is not None else None,
        switch,
        required,
        check,
    )
    if shown is None:
        shown = "off" if switch else "none" if default is None else str(default)
    where = "required" if required else f"default: {shown}"
    text = f"{help} ({where}; env {p._shown_variables(opt)})".replace("%", "%%")
    flags = [short, flag] if short else [flag]
    if switch:
        p.add_argument(*flags, dest=opt.dest, action="store_true", default=None, help=text)
    else:
        if metavar is None and choices is not None:
            metavar = "{" + ",".join(choices) + "}"
        p.add_argument(*flags, dest=opt.dest, default=None, metavar=metavar, help=text)
    p.options.append(opt)
    return opt


def _value(opt: Option, raw: Any, name: str) -> Any:
    """`raw` (a flag's or variable's string, or a config file's value) converted and
    checked as `opt` requires; errors blame `name`."""
    if opt.switch:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ON:
            return True
        if text in OFF:
            return False
        raise UsageError(
            f"{name}: {raw!r} is neither on ({', '.join(ON)}) nor off ({', '.join(OFF)})"
        )
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise UsageError(f"{name}: expected one value, not {raw!r}")
    text = str(raw)
    if opt.choices is not None and text not in opt.choices:
        raise UsageError(f"{name}: invalid choice: {text!r} (choose from {', '.join(opt.choices)})")
    try:
        value = opt.type(text)
    except (TypeError, ValueError):
        kind = getattr(opt.type, "__name__", "")
        raise UsageError(f"{name}: invalid {kind} value: {text!r}") from None
    if opt.check is not None and (why := opt.check(name, value)):
        raise UsageError(why)
    return value


def load_config(path: str, p: Parser, blame: str) -> dict[str, tuple[str, Any]]:
    """``serve --config FILE``: flag -> (its key in the file, its value). TOML for a ``.toml``
    file, else YAML (JSON included); keys are the long options, with dashes or underscores."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"{blame}: cannot read {path}: {e.strerror or e}") from None
    data: Any
    if path.endswith(".toml"):
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: not valid TOML: {e}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UsageError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected keys and values, e.g. cache-mb = 64")
    known = {o.flag[2:]: o for o in p.options if o.flag != "--config"}
    found: dict[str, tuple[str, Any]] = {}
    unknown = []
    for key, value in data.items():
        opt = known.get(str(key).replace("_", "-"))
        if opt is None:
            unknown.append(str(key))
        elif opt.flag in found:
            raise UsageError(f"{path}: {found[opt.flag][0]} and {key} are the same option")
        else:
            found[opt.flag] = (str(key), value)
    if unknown:
        raise UsageError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}: the keys are "
            f"{p.prog.split()[-1]}'s long options without the dashes, e.g. cache-mb"
        )
    return found


def _resolve(
    p: Parser,
    options: list[Option],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config: Mapping[str, tuple[str, Any]],
    config_path: str | None,
) -> None:
    action = getattr(args, p.per_action, None) if p.per_action else None
    origins: dict[str, str] = args._origins
    for opt in options:
        given = getattr(args, opt.dest, None)
        if given is not None:
            value = _value(opt, given, opt.flag)
            origins[opt.dest] = opt.flag
        elif name := next((n for n in p.variables(opt, action) if environ.get(n)), None):
            value = _value(opt, environ[name], f"{name} ({opt.flag})")
            origins[opt.dest] = name
        elif opt.flag in config:
            key, raw = config[opt.flag]
            value = _value(opt, raw, f"{key} in {config_path} ({opt.flag})")
            origins[opt.dest] = f"{config_path}: {key}"
        elif opt.required:
            names = " or ".join(p.variables(opt, action))
            also = (
                ", or in the --config file" if any(o.flag == "--config" for o in p.options) else ""
            )
            raise UsageError(f"{opt.flag} is required (or {names}{also})")
        else:
            value = opt.default
        setattr(args, opt.dest, value)


def resolve(parser: Parser, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Give every option of the top level and of the chosen command its value, in place;
    raise :class:`UsageError` naming the flag, variable or file key of a bad one."""
    args._origins = {}
    args._variables = {}
    _resolve(parser, parser.options, args, environ, {}, None)
    sub = parser.commands[args.command]
    action = getattr(args, sub.per_action, None) if sub.per_action else None
    for opt in sub.options:
        args._variables[opt.flag] = sub.variables(opt, action)
    config_opts = [o for o in sub.options if o.flag == "--config"]
    _resolve(sub, config_opts, args, environ, {}, None)
    path = getattr(args, "config", None) if config_opts else None
    config = load_config(path, sub, args._origins["config"]) if path else {}
    rest = [o for o in sub.options if o.flag != "--config"]
    _resolve(sub, rest, args, environ, config, path)


def origin(args: argparse.Namespace, dest: str) -> str:
    """Where the value of option `dest` came from: its flag, variable or config key."""
    found: str = getattr(args, "_origins", {}).get(dest, "--" + dest.replace("_", "-"))
    return found


def how_to_set(args: argparse.Namespace, flag: str) -> str:
    """``--port (or TABLECAST_SERVE_PORT or TABLECAST_PORT)``: how to give option `flag`."""
    names = getattr(args, "_variables", {}).get(flag)
    return f"{flag} (or {' or '.join(names)})" if names else flag


def ensure_free(args: argparse.Namespace, flag: str, host: str, port: int, what: str = "") -> None:
    """Fail in one line naming the option (and its variables) to change when nothing can
    listen on `host`:`port` (another process has it), before anything starts."""
    from tablecast.cli.errors import Failure
    from tablecast.http.listen import cannot_listen

    if why := cannot_listen(host, port):
        raise Failure(f"{why}{what}; choose another {how_to_set(args, flag)}")
