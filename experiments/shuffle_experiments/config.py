"""The experiment's YAML config: schema, validation with one-line messages, ``--set`` overrides.

A config is validated completely before any work starts. Every problem is reported as one line
that names the field, e.g. ``training.rounds must be a positive integer, got -1``; unknown keys,
wrong types and out-of-range values all fail this way (:class:`ConfigError`, a ``ValueError``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from shuffle_opacus import PROTOCOLS, get_protocol
from shuffle_opacus.accounting.history import MIN_DELTA
from shuffle_opacus.accounting.protocols import resolve_sensitivity
from shuffle_opacus.common.suggestions import did_you_mean

from .datasets import DatasetError, check_data
from .renamed_keys import ConfigDeprecationWarning, rename_old_keys, renamed_path
from .yaml_files import MAX_YAML_DEPTH, ConfigError, _parse_yaml

__all__ = [
    "BASELINES",
    "ClientsConfig",
    "ALL_CURVES",
    "ConfigDeprecationWarning",
    "ConfigError",
    "ExperimentConfig",
    "curve_names",
    "load_config",
    "apply_overrides",
    "read_yaml",
]

#: Upper bounds that keep every count a machine integer and every run finite: rounds (and the
#: intervals counted in rounds), clients and examples (MNIST has 70,000), torch threads, seed
#: (``torch.manual_seed`` takes 64-bit seeds).
MAX_ROUNDS = 10**8
MAX_CLIENTS = 10**8
MAX_THREADS = 1024
MAX_SEED = 2**63 - 1
#: Deepest nesting of a YAML document or a ``--set`` key (a config nests two levels); deeper
#: documents are refused before PyYAML's recursive composer runs out of stack.
#: The approximate-DP baselines and the protocols they exist for.
BASELINES: dict[str, tuple[str, ...]] = {"clones": ("checkin", "full")}


def curve_names(protocol: str) -> tuple[str, ...]:
    """Return the curves a run of ``protocol`` can report (see :mod:`.curves`).

    ``exact`` (the protocol's Rényi bound), every method (``pld`` first, the accountant's
    default) and reference curve of its analysis, and the baselines that exist for it.
    """
    spec = get_protocol(protocol)
    baselines = tuple(b for b, kinds in BASELINES.items() if spec.name in kinds)
    names = ("exact", *spec.methods, *spec.references, *baselines)
    return tuple(dict.fromkeys(names))


#: Every curve name, over all protocols.
ALL_CURVES: tuple[str, ...] = tuple(
    dict.fromkeys(name for protocol in PROTOCOLS for name in curve_names(protocol))
)


class _Section(BaseModel):
    # Strict: no bool-as-int, no "5"-as-int. Floats may still be written as ints, and as
    # strings such as "1e-5" because PyYAML reads exponent notation without a dot as a string.
    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _numeric_strings(cls, value: Any, info: Any) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, str) and _accepts_float(annotation):
            try:
                return float(value)
            except ValueError:
                return value
        return value


def _accepts_float(annotation: Any) -> bool:
    if annotation is float:
        return True
    return float in getattr(annotation, "__args__", ())


class DataConfig(_Section):
    """The dataset (:mod:`.datasets`), where its files are, and how many examples take part."""

    #: A registered dataset: ``mnist``, ``npz`` (a user's arrays at ``path``) or one of yours.
    name: str = Field(default="mnist", min_length=1)
    source: Literal["auto", "torchvision", "idx", "pickle"] = "auto"
    root: str | None = None
    pickle_path: str | None = None
    path: str | None = Field(default=None, min_length=1)
    train_subset: int | None = Field(default=None, gt=0, le=MAX_CLIENTS)
    test_subset: int | None = Field(default=None, gt=0, le=MAX_CLIENTS)
    #: ``standard``: (x - mean) / sd, the dataset's constants; ``unit``: the arrays as loaded.
    normalize: Literal["standard", "unit"] = "standard"


#: The models of :mod:`.models` that ship with the experiment (their names need no torch import).
_BUILT_IN_MODELS = ("cnn", "cnn_small", "mlp")


class ModelConfig(_Section):
    """The network trained by the clients."""

    #: A model of :data:`~shuffle_experiments.models.MODELS`: a built-in one, or one given to
    #: :func:`~shuffle_experiments.models.register_model` before the config is read.
    name: str = "cnn"

    @field_validator("name")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value in _BUILT_IN_MODELS:
            return value
        from .models import MODELS  # imports torch: only for a registered model's name

        if value not in MODELS:
            raise ValueError(
                f"must be one of {', '.join(MODELS)} (or a name given to register_model"
                f"{did_you_mean(value, list(MODELS)).replace(' (', '; ', 1) or ')'}"
            )
        return value


class ProtocolConfig(_Section):
    """Which clients report each round."""

    kind: Literal["checkin", "subsampled", "full"] = "checkin"
    rate: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    sample_size: int | None = Field(default=None, gt=0, le=MAX_CLIENTS)


def _known_curve(name: str) -> str:
    if name not in ALL_CURVES:
        raise ValueError(f"must be one of {ALL_CURVES}")
    return name


class PrivacyConfig(_Section):
    """Clipping, local noise and accounting.

    ``curves`` lists the epsilon curves the run reports (see :mod:`.curves`); its old name
    ``accountants`` is still read, with a note (:mod:`.renamed_keys`).
    """

    clipping_norm: float = Field(gt=0, allow_inf_nan=False)
    noise_multiplier: float = Field(gt=0, allow_inf_nan=False)
    sensitivity: float | Literal["replace-one", "paper"] = "replace-one"
    delta: float = Field(default=1e-5, gt=0, lt=1, allow_inf_nan=False)
    curves: list[Annotated[str, AfterValidator(_known_curve)]] = Field(
        default_factory=lambda: ["pld", "proven", "exact", "theorem3", "no-shuffle", "central"],
        min_length=1,
    )
    noise_mode: Literal["sum", "per_client"] = "sum"

    @field_validator("delta")
    @classmethod
    def _delta_floor(cls, value: float) -> float:
        if value < MIN_DELTA:
            raise ValueError(
                f"must be in [{MIN_DELTA:g}, 1) (a smaller delta underflows the accounting's "
                f"arithmetic)"
            )
        return value

    @field_validator("sensitivity")
    @classmethod
    def _positive(cls, value: float | str) -> float | str:
        resolve_sensitivity(value)
        return value

    @property
    def accountants(self) -> list[str]:
        """Deprecated (kept for one release): the old name of :attr:`curves`."""
        warnings.warn(
            "PrivacyConfig.accountants is the old name of PrivacyConfig.curves; use curves",
            ConfigDeprecationWarning,
            stacklevel=2,
        )
        return self.curves


class OptimizerConfig(_Section):
    """The server's optimizer."""

    name: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(gt=0, allow_inf_nan=False)
    momentum: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False)
    schedule: Literal["constant", "cosine"] = "constant"
    #: Rounds of linear warm-up from 0 to ``lr`` before the schedule.
    warmup: int = Field(default=0, ge=0, le=MAX_ROUNDS)


class TrainingConfig(_Section):
    """Rounds, evaluation and checkpoints."""

    rounds: int = Field(gt=0, le=MAX_ROUNDS)
    eval_every: int = Field(default=100, gt=0, le=MAX_ROUNDS)
    checkpoint_every: int = Field(default=500, gt=0, le=MAX_ROUNDS)
    #: Also write a checkpoint once this many minutes have passed since the last one (a hard
    #: kill then loses minutes, not rounds); ``0`` for rounds only.
    checkpoint_minutes: float = Field(default=10.0, ge=0, le=10_000, allow_inf_nan=False)
    grad_sample_mode: Literal["hooks", "functorch", "ew", "fast"] = "hooks"
    micro_batch: int | None = Field(default=200, gt=0, le=MAX_CLIENTS)
    #: Torch threads; ``auto`` takes the cores this process may use minus those the machine's
    #: load keeps busy (at least 1), measured when the run starts and written into the run's
    #: config.yaml, so that a resume uses the same number (results depend on it in the last
    #: digits).
    threads: int | Literal["auto"] = Field(default="auto")

    @field_validator("threads")
    @classmethod
    def _threads(cls, value: int | str) -> int | str:
        if value == "auto" or (
            isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_THREADS
        ):
            return value
        raise ValueError(f"must be auto or an integer in [1, {MAX_THREADS}]")

    #: ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
    device: str = "auto"
    #: Decay of an exponential moving average of the weights, evaluated instead of the weights
    #: themselves (post-processing of the private trajectory); ``null`` for none.
    ema: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
            return value
        raise ValueError("must be auto, cpu, cuda or cuda:N")


class ClientsConfig(_Section):
    """User-level training: the training examples split into clients that train locally.

    Without this section one training example is one client (example level). With it, the
    ``data.train_subset`` examples (all by default) are split into ``count`` clients (seeded, or
    ``partition: dataset``: the dataset's own), each participant trains locally and reports
    its clipped, noised update (:func:`shuffle_opacus.federated.make_private_clients`);
    ``privacy.clipping_norm`` bounds a client's whole update, every epsilon counts ``count``
    clients and the optimizer is the server's (SGD with ``lr: 1`` is FedAvg).
    """

    count: int = Field(gt=0, le=MAX_CLIENTS)
    partition: Literal["iid", "dirichlet", "shards", "dataset"] = "iid"
    #: Dirichlet concentration over the labels (``partition: dirichlet``).
    alpha: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    #: Label shards per client (``partition: shards``).
    shards_per_client: int | None = Field(default=None, gt=0, le=MAX_CLIENTS)
    local_steps: int | None = Field(default=None, gt=0, le=1 << 20)
    local_epochs: int | None = Field(default=None, gt=0, le=1 << 20)
    #: Examples per local step; ``null``: the whole client.
    local_batch_size: int | None = Field(default=None, gt=0, le=MAX_CLIENTS)
    client_lr: float = Field(gt=0, allow_inf_nan=False)
    average: Literal["expected", "reports"] = "expected"
    #: Clients trained together in one vectorised call.
    chunk: int = Field(default=128, gt=0, le=MAX_CLIENTS)


class ExperimentConfig(_Section):
    """The whole experiment."""

    name: str = Field(min_length=1)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    output_dir: str = Field(min_length=1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    protocol: ProtocolConfig
    privacy: PrivacyConfig
    optimizer: OptimizerConfig
    training: TrainingConfig
    clients: ClientsConfig | None = None

    @field_validator("name")
    @classmethod
    def _one_directory(cls, value: str) -> str:
        # The run directory is output_dir/name/<timestamp>: a name with a separator, '..' or an
        # absolute path would put it (and ``latest``) outside output_dir.
        if value in (".", "..") or any(c in value for c in "/\\\0"):
            raise ValueError(
                "must be one directory name inside output_dir (no '/', '\\', '.' or '..')"
            )
        return value

    def check_consistency(self) -> None:
        """Cross-field checks that a per-field schema cannot express.

        Raises:
            ConfigError: naming the offending field.
        """
        p = self.protocol
        # Which of protocol.rate / protocol.sample_size a protocol takes comes from the
        # library's protocol table (Protocol.option), not from a copy of it here.
        needed = get_protocol(p.kind).option
        for field, value in (("rate", p.rate), ("sample_size", p.sample_size)):
            if field == needed and value is None:
                raise ConfigError(
                    f"protocol.{field} is required for protocol.kind {p.kind}, got null"
                )
            if field != needed and value is not None:
                users = [k for k, spec in PROTOCOLS.items() if spec.option == field]
                raise ConfigError(
                    f"protocol.{field} applies to {' and '.join(users)} only, got {value!r}"
                )
        try:
            examples = check_data(self.data, self.clients)
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None
        clients = examples if self.clients is None else self.clients.count
        if self.clients is not None:
            self._check_clients(self.clients, examples)
        if p.rate is not None and p.rate * clients < 1e-6:
            raise ConfigError(
                f"protocol.rate must be >= {1e-6 / clients:.3g} (at least one report expected "
                f"per million rounds with {clients} clients), got {p.rate!r}"
            )
        if p.sample_size is not None and p.sample_size >= clients:
            raise ConfigError(
                f"protocol.sample_size must be < the number of clients ({clients}), got "
                f"{p.sample_size}"
            )
        if self.optimizer.warmup >= self.training.rounds:
            raise ConfigError(
                f"optimizer.warmup must be < training.rounds ({self.training.rounds}), got "
                f"{self.optimizer.warmup}"
            )
        if len(set(self.privacy.curves)) != len(self.privacy.curves):
            raise ConfigError(f"privacy.curves must not repeat a name, got {self.privacy.curves}")
        allowed = curve_names(p.kind)
        for name in self.privacy.curves:
            if name not in allowed:
                raise ConfigError(
                    f"privacy.curves {name} is not available for protocol.kind {p.kind} "
                    f"(available: {', '.join(allowed)})"
                )

    def _check_clients(self, c: ClientsConfig, examples: int) -> None:
        if c.count > examples:
            raise ConfigError(
                f"clients.count must be <= the number of training examples ({examples}), got "
                f"{c.count}"
            )
        if (c.local_steps is None) == (c.local_epochs is None):
            raise ConfigError(
                f"clients: give exactly one of local_steps and local_epochs, got local_steps="
                f"{c.local_steps!r}, local_epochs={c.local_epochs!r}"
            )
        needed = {"dirichlet": "alpha", "shards": "shards_per_client"}.get(c.partition)
        for field in ("alpha", "shards_per_client"):
            value = getattr(c, field)
            if field == needed and value is None:
                raise ConfigError(
                    f"clients.{field} is required for clients.partition {c.partition}"
                )
            if field != needed and value is not None:
                raise ConfigError(
                    f"clients.{field} applies to partition "
                    f"{'dirichlet' if field == 'alpha' else 'shards'} only, got {value!r}"
                )
        if c.shards_per_client is not None and c.count * c.shards_per_client > examples:
            raise ConfigError(
                f"clients.shards_per_client must be <= {examples // c.count} for {c.count} "
                f"clients and {examples} images, got {c.shards_per_client}"
            )


def _annotation(loc: Sequence[Any]) -> Any:
    model: Any = ExperimentConfig
    annotation: Any = None
    for item in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(item, str) or fields is None or item not in fields:
            break
        annotation = fields[item].annotation
        # An optional section (``clients: ClientsConfig | None``) is walked into like any other.
        sections = [a for a in getattr(annotation, "__args__", ()) if hasattr(a, "model_fields")]
        model = sections[0] if sections else annotation
    return annotation


def _describe(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "greater_than":
        annotation = _annotation(error["loc"])
        is_int = annotation is int or int in getattr(annotation, "__args__", ())
        if ctx.get("gt") == 0 and is_int:
            return "must be a positive integer"
        return f"must be > {ctx.get('gt')}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge')}"
    if kind == "less_than":
        return f"must be < {ctx.get('lt')}"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le')}"
    if kind in ("int_parsing", "int_type", "int_from_float", "bool_type"):
        return "must be an integer"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("float_parsing", "float_type"):
        return "must be a number"
    if kind in ("string_type",):
        return "must be a string"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "extra_forbidden":
        return "is not a known key"
    if kind == "missing":
        return "is required"
    if kind in ("model_type", "dict_type"):
        return "must be a mapping of keys to values"
    if kind in ("list_type",):
        return "must be a list"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"])).rstrip(".")
    return str(error["msg"])


def _field_name(loc: Sequence[Any]) -> str:
    # Drop the union-branch tags pydantic inserts (e.g. 'float', "literal['a','b']").
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif isinstance(item, str) and not (item in ("float", "int", "str") or "[" in item):
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "config"


def _known_keys(loc: Sequence[Any]) -> list[str]:
    """Return the keys the section at ``loc`` (without its last part) accepts."""
    model: Any = ExperimentConfig
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _one_line(exc: ValidationError) -> str:
    errors = exc.errors()
    # An unknown key first: a misspelt required key is reported as unknown (with the closest
    # known key), not only as the required key it leaves missing.
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        loc = unknown[0]["loc"]
        hint = did_you_mean(str(loc[-1]), _known_keys(loc))
        return f"{_field_name(loc)} is not a known key{hint}, got {unknown[0].get('input')!r}"
    # For a union (sensitivity: number or name), report one message rather than each branch.
    first = errors[0]
    field = _field_name(first["loc"])
    if field.endswith("sensitivity"):
        return (
            f"{field} must be replace-one, paper or a number in [1, 2], got {first.get('input')!r}"
        )
    return f"{field} {_describe(first)}, got {first.get('input')!r}"


def validate(raw: Any) -> ExperimentConfig:
    """Validate a parsed YAML document.

    Args:
        raw: The document (a mapping).

    Returns:
        The validated :class:`ExperimentConfig`. A key under its old name
        (``privacy.accountants``) is read under its new one with a
        :class:`ConfigDeprecationWarning`.

    Raises:
        ConfigError: on the first problem, as one line naming the field (giving a key under
            both its old and its new name included).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config must be a mapping of sections, got {type(raw).__name__}")
    raw = rename_old_keys(raw)
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None
    config.check_consistency()
    return config


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a copy of ``raw``.

    Args:
        raw: The parsed config.
        overrides: Strings ``dotted.key=value``.

    Returns:
        The updated copy. An override of ``privacy.accountants`` (the old name) sets
        ``privacy.curves``, with a :class:`ConfigDeprecationWarning`; one of either name
        replaces the list whichever name the file gives it.

    Raises:
        ConfigError: for an override without ``=``, whose value is not YAML, or whose path
            crosses a non-mapping.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config must be a mapping of sections, got {type(raw).__name__}")
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(raw)))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        path = key.strip().split(".")
        if len(path) > MAX_YAML_DEPTH:
            raise ConfigError(
                f"--set expects a key of at most {MAX_YAML_DEPTH} levels, got {len(path)}"
            )
        path = renamed_path(path, out)  # privacy.accountants is privacy.curves
        node: Any = out
        for part in path[:-1]:
            if part not in node or node[part] is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section, got {item!r}")
        shown = text if len(text) <= 60 else f"{text[:57]}..."
        node[path[-1]] = _parse_yaml(text, f"--set {key.strip()}: the value {shown!r}")
    return out


def read_yaml(path: str | Path, what: str) -> Any:
    """Read and parse a YAML file, refusing repeated keys; every problem is one line.

    Args:
        path: The file.
        what: How messages name it (``"config file"``, ``"sweep file"``).

    Returns:
        The parsed document (``None`` for an empty file).

    Raises:
        ConfigError: if the file is missing, a directory, unreadable, not UTF-8 or not YAML.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory, not a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read ({exc.strerror})") from None
    return _parse_yaml(text, f"{what} {path}")


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read, override and validate a YAML config.

    Args:
        path: The YAML file.
        overrides: ``--set`` strings applied before validation.

    Returns:
        The validated config.

    Raises:
        ConfigError: if the file is missing, unreadable, not UTF-8, not YAML (a repeated key
            included), or invalid.
    """
    raw = read_yaml(path, "config file")
    return validate(apply_overrides(raw or {}, overrides))
