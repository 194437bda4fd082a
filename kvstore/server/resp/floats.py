"""INCRBYFLOAT's arithmetic as Redis does it on x86-64: in x87 long double
(a 64-bit mantissa), the result written with ``%.17Lf`` less its trailing
zeros. Emulated exactly with :class:`fractions.Fraction`, so that walkv
stores the same bytes Redis would (``9223372036854775807 + 0.5`` is
``9223372036854775807.5``, where a 64-bit double would say ...808).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

MANTISSA: Final = 64
MAX_EXPONENT: Final = 16384  # beyond 2**16384 a long double is infinite
_NUMBER: Final = re.compile(r"([+-]?)(?:(\d+)\.?(\d*)|\.(\d+))(?:[eE]([+-]?\d+))?")


class NotANumber(ValueError):
    """Text strtold would not read as a finite long double."""


def parse(text: bytes) -> Fraction:
    """The long double ``strtold`` reads from ``text`` (decimal, optionally an exponent)."""
    m = _NUMBER.fullmatch(text.decode("ascii", "replace"))
    if m is None:
        raise NotANumber(text)
    sign, whole, frac, only_frac, exp = m.groups()
    digits = (whole or "") + (frac if whole is not None else only_frac)
    scale = len(frac or "") if whole is not None else len(only_frac)
    power = int(exp or 0) - scale
    if abs(power) > 20000:
        raise NotANumber(text)
    value = Fraction(int(digits or "0")) * Fraction(10) ** power
    return round_ld(-value if sign == "-" else value)


def round_ld(x: Fraction) -> Fraction:
    """``x`` rounded (to nearest, ties to even) to a 64-bit mantissa; NotANumber past the range."""
    if x == 0:
        return Fraction(0)
    negative = x < 0
    x = -x if negative else x
    shift = MANTISSA - (x.numerator.bit_length() - x.denominator.bit_length())
    if x * Fraction(2) ** shift >= 1 << MANTISSA:
        shift -= 1
    elif x * Fraction(2) ** shift < 1 << (MANTISSA - 1):
        shift += 1
    n = round(x * Fraction(2) ** shift)
    if -shift + MANTISSA > MAX_EXPONENT:
        raise NotANumber("overflow")
    result = Fraction(n) / Fraction(2) ** shift
    return -result if negative else result


def format_ld(x: Fraction) -> bytes:
    """``%.17Lf`` of ``x``, trailing zeros (and a bare point) removed, ``-0`` as ``0``."""
    scaled = x * 10**17
    n = round(scaled)  # glibc's printf rounds the exact value, ties to even
    sign = "-" if n < 0 else ""
    digits = str(abs(n)).rjust(18, "0")
    text = f"{sign}{digits[:-17]}.{digits[-17:]}".rstrip("0").rstrip(".")
    return b"0" if text in ("-0", "") else text.encode()


def add(current: bytes | None, increment: bytes) -> bytes:
    """INCRBYFLOAT's new value: ``current`` (None: 0) plus ``increment``."""
    value = round_ld((parse(current) if current is not None else Fraction(0)) + parse(increment))
    return format_ld(value)
