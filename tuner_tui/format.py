"""How figures are written: on the dashboard (short, fixed-width-friendly, "—" for unknown) and in
the tables and progress lines of `bench` and `tune`. Torch-free; the one place numbers are formatted."""

from __future__ import annotations

UNKNOWN = "—"


def rate(value: float | None) -> str:
    """12.3k, 1.20M: tokens/s and samples/s."""
    if value is None:
        return UNKNOWN
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}" if abs(value) < 100 * factor else f"{value / factor:.0f}{suffix}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def size(num_bytes: float | None) -> str:
    """1.5 GiB, 312 MiB."""
    if num_bytes is None:
        return UNKNOWN
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def percent(value: float | None, digits: int = 0) -> str:
    return UNKNOWN if value is None else f"{value:.{digits}f}%"


def fraction(value: float | None) -> str:
    """MFU and other 0..1 ratios, as percent."""
    return UNKNOWN if value is None else f"{100 * value:.1f}%"


def milliseconds(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def spread(value: float | None) -> str:
    """A relative spread: ±1.2%."""
    return UNKNOWN if value is None else f"±{100 * value:.1f}%"


def seconds(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(round(value)), 60)
    return f"{minutes}m{secs:02d}s"


def speedup(value: float | None) -> str:
    """Change against the baseline as a factor: ×1.23."""
    return UNKNOWN if value is None else f"×{value:.2f}"


def loss(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    if value != value:  # NaN
        return "nan"
    return f"{value:.4g}"


def si(value: float) -> str:
    """Throughput in tables and progress lines, one decimal more than `rate`: 504.2k, 1.21M."""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def gib(num_bytes: int | float | None, unit: bool = True) -> str:
    """Bytes as GiB with two decimals ("1.50 GiB"; "1.50" with unit=False, for table columns);
    with the unit, under 1 GiB as `size` writes it ("14.9 MiB", not "0.01 GiB")."""
    if num_bytes is None:
        return "-"
    if unit and abs(num_bytes) < 2**30:
        return size(num_bytes)
    return f"{num_bytes / 2**30:.2f}" + (" GiB" if unit else "")


def clock(seconds: float) -> str:
    """Elapsed time as 3m07s."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
