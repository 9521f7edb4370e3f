"""--overrides-file: overrides kept in a file (hpctrain tune writes the best settings as one)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from hpctrain import bounded
from hpctrain.config.overrides import chosen_twice
from hpctrain.errors import ConfigError

MAX_OVERRIDES = 10_000  # best.yaml holds a few; a sweep's values go in one override each


def overrides_file(path: Path) -> list[str]:
    """The overrides of an override file (hpctrain tune's best.yaml): a YAML list of KEY=VALUE."""

    def bad(why: str) -> ConfigError:
        return ConfigError.one(
            "--overrides-file",
            f"{path}: {why}",
            "give a YAML list of overrides, e.g. - parallelism.bucket_mb=5",
        )

    try:
        data = yaml.safe_load(bounded.read_text(path, bounded.SMALL))
    except OSError as e:
        raise bad(f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise bad(f"is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except RecursionError:
        raise bad("nests deeper than Python can read") from None
    except yaml.YAMLError as e:
        raise bad(f"is not YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(x, str) and "=" in x for x in data):
        raise bad("is not a list of KEY=VALUE strings")
    if len(data) > MAX_OVERRIDES:
        raise bad(f"holds {len(data)} overrides; hpctrain takes at most {MAX_OVERRIDES} from a file")
    for note in chosen_twice(data, f"in {path}"):
        print(f"hpctrain: note: {note}", file=sys.stderr)
    return list(data)
