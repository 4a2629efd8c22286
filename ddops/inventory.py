"""The inventory: which hosts exist, how to reach them over SSH, what GPUs they have.

    defaults:            # merged into every host (labels merged key by key)
      ssh_user: ops                   # unset: the ssh config's User, else root
      become: sudo                    # ops runs every remote action through sudo
      become_password_env: DDOPS_SUDO_PASSWORD   # or become_password_file; neither: sudo -n
      known_hosts: known_hosts        # relative paths are relative to this file
      ssh_config: ssh_config          # default ~/.ssh/config: Host aliases, ProxyJump, ...
    hosts:
      lab-1:
        address: 10.77.0.11
        gpu: {kind: RTX A6000, count: 2, memory_gb: 48}
        labels: {role: prod}
        mirror: false                 # never copy this host's requests to a shadow (default true;
                                      # a profile must opt in too: docs/mirror.md)

Found in this order: an explicit path, $DDOPS_INVENTORY, ./inventory.yaml, lab/inventory.yaml
of the source tree, $DDOPS_LAB_DIR/inventory.yaml (the last two written by `ddops lab up`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddops.profile.problems import located, schema_problem
from ddops.profile.yamlfile import ConfigError, YamlDoc, dotted, problem, read_yaml

DEFAULT_LAB_DIR = "/var/lib/ddops/lab"
# `ddops lab up` run from a source tree writes here (docs/contracts.md section 4).
REPO_LAB_INVENTORY = Path(__file__).resolve().parent.parent / "lab" / "inventory.yaml"
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class InventoryError(ConfigError):
    """An inventory that cannot be used; `.problems` holds one line per problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Gpu(_Strict):
    kind: Annotated[str, Field(min_length=1)]
    count: Annotated[int, Field(ge=1)] = 1
    memory_gb: Annotated[float, Field(gt=0)]


class Host(_Strict):
    name: Annotated[str, Field(pattern=NAME)]
    address: Annotated[str, Field(pattern=r"^[0-9A-Za-z.:\[\]-]+$")]
    ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    ssh_user: Annotated[str, Field(min_length=1)] = "root"
    ssh_key: Path | None = None
    known_hosts: Path | None = None
    ssh_config: Path | None = None          # OpenSSH client config (default ~/.ssh/config)
    become: Literal["sudo"] | None = None   # run as root through sudo (ssh_user is not root)
    become_password_env: Annotated[str, Field(min_length=1)] | None = None
    become_password_file: Path | None = None
    gpu: Gpu | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    mirror: bool = True   # false: `ddops shadow start --mirror` refuses this host as production

    def matches(self, labels: dict[str, str]) -> bool:
        return all(self.labels.get(key) == value for key, value in labels.items())


class Inventory(_Strict):
    path: Path | None = None
    hosts: dict[str, Host] = Field(default_factory=dict)
    notify: list[dict] = Field(default_factory=list)  # rollout webhooks (ddops.rollout.fleet.notify)

    def select(self, labels: dict[str, str]) -> list[Host]:
        """Hosts carrying every given label, in inventory order."""
        return [host for host in self.hosts.values() if host.matches(labels)]

    def host(self, name: str) -> Host:
        if name not in self.hosts:
            known = ", ".join(self.hosts) or "none"
            raise InventoryError([problem(str(self.path or "inventory"), f"hosts.{name}",
                                          f"no such host (known: {known})")])
        return self.hosts[name]


def lab_dir() -> Path:
    return Path(os.environ.get("DDOPS_LAB_DIR") or DEFAULT_LAB_DIR)


def find_inventory(path: Path | None = None) -> Path | None:
    """The inventory file to use, or None when there is none anywhere."""
    if path is not None:
        return Path(path)
    if os.environ.get("DDOPS_INVENTORY"):
        return Path(os.environ["DDOPS_INVENTORY"])
    for candidate in (Path("inventory.yaml"), REPO_LAB_INVENTORY, lab_dir() / "inventory.yaml"):
        if candidate.is_file():
            return candidate
    return None


def load_inventory(path: Path | None = None) -> Inventory:
    found = find_inventory(path)
    if found is None:
        raise InventoryError(["inventory: none found (pass --inventory, set DDOPS_INVENTORY, "
                              "create ./inventory.yaml, or run `ddops lab up`)"])
    doc, problems = read_yaml(found)
    if problems:
        raise InventoryError(problems)
    return _build(doc)


def _build(doc: YamlDoc) -> Inventory:
    data = doc.data if doc.data is not None else {}
    if not isinstance(data, dict):
        raise InventoryError([problem(doc.display, None, "top level must be a mapping")])
    where = {dotted(k): (doc.display, line) for k, line in doc.lines.items()}
    unknown = sorted(set(data) - {"defaults", "hosts", "notify"})
    if unknown:
        raise InventoryError([located(key, "unknown key (known: defaults, hosts, notify)", doc.display, where)
                              for key in unknown])
    notify = data.get("notify") or []
    if not isinstance(notify, list) or not all(isinstance(n, dict) for n in notify):
        raise InventoryError([located("notify", "must be a list of webhooks ({url: ...} or {url_env: NAME})",
                                      doc.display, where)])
    defaults, hosts = data.get("defaults") or {}, data.get("hosts") or {}
    for key, value in (("defaults", defaults), ("hosts", hosts)):
        if not isinstance(value, dict):
            raise InventoryError([located(key, "must be a mapping", doc.display, where)])
    problems: list[str] = []
    built: dict[str, Host] = {}
    for name, entry in hosts.items():
        host = _host(str(name), entry, defaults, doc, where, problems)
        if host is not None:
            built[host.name] = host
    if problems:
        raise InventoryError(problems)
    return Inventory(path=doc.path, hosts=built, notify=notify)


def _host(name: str, entry: object, defaults: dict, doc: YamlDoc, where: dict,
          problems: list[str]) -> Host | None:
    if not isinstance(entry, dict):
        problems.append(located(f"hosts.{name}", "must be a mapping", doc.display, where))
        return None
    merged = {**defaults, **entry, "name": name}
    base_labels, own_labels = defaults.get("labels") or {}, entry.get("labels") or {}
    if isinstance(base_labels, dict) and isinstance(own_labels, dict):
        merged["labels"] = {**base_labels, **own_labels}
    for key in ("ssh_key", "known_hosts", "ssh_config", "become_password_file"):
        if isinstance(merged.get(key), str):
            merged[key] = (doc.path.parent / Path(merged[key]).expanduser()).resolve()
    try:
        return Host.model_validate(merged)
    except ValidationError as exc:
        for err in exc.errors():
            first = err["loc"][0]
            from_defaults = first in defaults and first not in entry and first != "name"
            prefix = ("defaults",) if from_defaults else ("hosts", name)
            problems.append(schema_problem(err, Host, doc.display, where, prefix))
        return None
