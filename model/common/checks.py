"""The one set of value checks every entry point uses: the page and the API (app/settings.py), the
CLI and the library's own configs (generation requests, the decoder, schedules, sampling, training,
eval). Each returns the checked value or raises a ValueError that names the setting and quotes
the value (capped, so a huge value cannot flood a message).

``text=True`` is for values a person or a client typed (the page, the API, a shared link): a
number may come as text ("3", "0.5"), a whole number as a float (3.0); everywhere else a number
must already be one (an int for a count). A bool is never a number, and None never a value.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

MESSAGE_CAP = 300  # characters of a refusal (it quotes the value it refuses)
EXACT_FLOAT_LIMIT = 2**53  # above this a float cannot hold every whole number


def _refuse(message: str) -> ValueError:
    return ValueError(message[:MESSAGE_CAP])


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _bounded(name: str, number: float, value: Any, low: float | None, high: float | None,
             above: float | None) -> None:
    if low is not None and number < low:
        raise _refuse(f"{name} must be >= {_show(low)}; got {value!r}")
    if above is not None and number <= above:
        raise _refuse(f"{name} must be > {_show(above)}; got {value!r}")
    if high is not None and number > high:
        raise _refuse(f"{name} must be <= {_show(high)}; got {value!r}")


def check_number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 above: float | None = None, text: bool = False) -> float:
    """A finite number in [low, high] (and > ``above``), as a float."""
    if isinstance(value, bool) or value is None or not (text or isinstance(value, (int, float))):
        raise _refuse(f"{name} must be a number; got {value!r}")
    try:
        number = float(value)  # with text: anything float() reads ("0.5", "1e3")
    except (TypeError, ValueError, OverflowError):
        raise _refuse(f"{name} must be a number; got {value!r}") from None
    if not math.isfinite(number):
        raise _refuse(f"{name} must be a finite number; got {value!r}")
    _bounded(name, number, value, low, high, above)
    return number


def check_int(name: str, value: Any, *, low: float | None = None, high: float | None = None,
              text: bool = False) -> int:
    """A whole number in [low, high], as an int. Whole numbers stay integers all the way (a seed
    near 2**63 must not pass through a float); with ``text`` a whole float up to 2**53 is read."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif not text:
        raise _refuse(f"{name} must be an integer; got {value!r}")
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        number = int(value.strip())
    else:
        real = check_number(name, value, text=True)
        if real != int(real):
            raise _refuse(f"{name} must be a whole number; got {value!r}")
        if abs(real) > EXACT_FLOAT_LIMIT:
            raise _refuse(f"{name}: send whole numbers above 2**53 as integers, not floats; got {value!r}")
        number = int(real)
    _bounded(name, number, value, low, high, None)
    return number


def check_choice(name: str, value: Any, options: Sequence[str]) -> str:
    """One of ``options``, exactly."""
    if not isinstance(value, str) or value not in options:
        raise _refuse(f"{name} must be one of {', '.join(options)}; got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """true or false only (True/False, "true"/"false" in any case, 1/0): "no" must not read as True."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _refuse(f"{name} must be true or false; got {value!r}")
