"""Arabic numerals and math signs in Mandarin text -> hanzi, the way the v2 front end reads them.

The rules, in the order they apply (the official normaliser's order, for the cases it covers):

* 12:30 -> 十二点半, 8:05 -> 八点五分; -3度 / -3℃ -> 零下三度;
* an operator between numbers: 3-2 -> 三减二, 1+1=2 -> 一加一等于二;
* 1/3 -> 三分之一; 25% -> 百分之二十五;
* 2024年 -> 二零二四年 (a year digit by digit); -5 -> 负五;
* a number before a measure word is a quantity: 3个 -> 三个, 2只 -> 两只, 1000000人 -> 一百万人;
* any other number of three or more digits is a code read digit by digit, 1 as 幺: 110 -> 幺幺零;
* the remaining numbers are read as quantities: 12.5 -> 十二点五;
* + - × ÷ = / become 加 减 乘 除 等 每.
"""
from __future__ import annotations

import re

_DIGITS = "零一二三四五六七八九"
_GROUP_UNITS = ("", "万", "亿", "万亿")  # each a step of four digits
_PLACE_UNITS = ("千", "百", "十", "")
_MAX_CARDINAL_DIGITS = 16
# Measure words (and units) after which a number is a quantity; multi-character ones first.
_MEASURE_WORDS = (
    "小时", "千克", "毫克", "微克", "公斤", "公分", "公里", "千米", "厘米", "毫米", "微米", "分米", "美元", "亿元", "万元",
    *"个只条张本件位次名人家户台架辆艘棵朵颗粒块片根支枝把双对套首篇页章段句层间座栋所场回遍趟顿餐杯碗瓶盒袋箱包",
    *"年月日号天周岁时分秒刻元角毛钱斤两克吨米里亩度项例批封行排队组班届期声步口头匹",
)
_MEASURE = "|".join(re.escape(word) for word in _MEASURE_WORDS)
_MATH_SIGNS = str.maketrans({"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等", "/": "每"})
_OPERATOR_WORDS = {"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等于"}

_NUMBER = r"\d+(?:\.\d+)?"
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_TIME = re.compile(r"(?<!\d)([01]?\d|2[0-3])[:：]([0-5]\d)(?!\d)")
_TEMPERATURE = re.compile(rf"(-?)({_NUMBER})(°C|℃|摄氏度|度)")
_OPERATION = re.compile(rf"(-?{_NUMBER})([+\-×÷=])(-?{_NUMBER})")
_FRACTION = re.compile(r"(-?)(\d+)/(\d+)")
_PERCENT = re.compile(rf"(-?)({_NUMBER})[%％]")
_YEAR = re.compile(r"(?<!\d)(\d{4}|\d{2})(?=年)")
_NEGATIVE = re.compile(rf"(?<![\d.])-({_NUMBER})")
_QUANTITY = re.compile(rf"(?<![\d.])({_NUMBER})([多余几+])?(?={_MEASURE})")
_CODE = re.compile(r"\d{3,}")
_DECIMAL_OR_INTEGER = re.compile(_NUMBER)


def read_numbers_zh(text: str) -> str:
    """``text`` with every number and math sign replaced by its Mandarin reading in hanzi."""
    text = _THOUSANDS_SEPARATOR.sub("", text)
    text = _TIME.sub(_read_time, text)
    text = _TEMPERATURE.sub(_read_temperature, text)
    while _OPERATION.search(text):  # 1+1=2 needs two passes: the match of 1+1 consumes the second 1
        text = _OPERATION.sub(lambda m: f"{m.group(1)}{_OPERATOR_WORDS[m.group(2)]}{m.group(3)}", text)
    text = _FRACTION.sub(lambda m: _sign(m.group(1)) + read_number(m.group(3)) + "分之" + read_number(m.group(2)), text)
    text = _PERCENT.sub(lambda m: _sign(m.group(1)) + "百分之" + read_number(m.group(2)), text)
    text = _YEAR.sub(lambda m: read_digits(m.group(1)), text)
    text = _NEGATIVE.sub(lambda m: "负" + read_number(m.group(1)), text)
    text = _QUANTITY.sub(_read_quantity, text)
    text = _CODE.sub(lambda m: read_digits(m.group(0)).replace("一", "幺"), text)
    text = _DECIMAL_OR_INTEGER.sub(lambda m: read_number(m.group(0)), text)
    return text.translate(_MATH_SIGNS)


def read_digits(digits: str) -> str:
    """"2024" -> 二零二四."""
    return "".join(_DIGITS[int(d)] for d in digits)


def read_number(number_text: str) -> str:
    """"12.5" -> 十二点五, "0.20" -> 零点二零 (trailing zeros after the point beyond one are dropped)."""
    whole, _, fraction = number_text.partition(".")
    spoken = read_integer_zh(whole)
    fraction = fraction.rstrip("0") + "0" if fraction.endswith("0") else fraction
    return spoken + "点" + read_digits(fraction) if fraction else spoken


def read_integer_zh(number_text: str) -> str:
    """"10005" -> 一万零五, "110" -> 一百一十, "15" -> 十五."""
    number_text = number_text.lstrip("0") or "0"
    if len(number_text) > _MAX_CARDINAL_DIGITS:
        return read_digits(number_text)
    number = int(number_text)
    if number == 0:
        return _DIGITS[0]
    groups = []
    while number:
        groups.append(number % 10000)
        number //= 10000
    spoken = ""
    zero_pending = False
    for group_index in reversed(range(len(groups))):
        group = groups[group_index]
        if group == 0:
            zero_pending = bool(spoken)
            continue
        if spoken and (zero_pending or group < 1000):
            spoken += _DIGITS[0]
        spoken += _read_group(group) + _GROUP_UNITS[group_index]
        zero_pending = False
    return spoken[1:] if spoken.startswith("一十") else spoken  # 十五, not 一十五


def _read_group(group: int) -> str:
    """0 < group < 10000 -> its hanzi with 千百十 and inner zeros read once (1005 -> 一千零五)."""
    spoken = ""
    zero_pending = False
    for digit, unit in zip(f"{group:04d}", _PLACE_UNITS):
        if digit == "0":
            zero_pending = bool(spoken)
            continue
        if zero_pending:
            spoken += _DIGITS[0]
            zero_pending = False
        spoken += _DIGITS[int(digit)] + unit
    return spoken


def _sign(minus: str) -> str:
    return "负" if minus else ""


def _read_time(match: re.Match) -> str:
    hours, minutes = match.group(1), match.group(2)
    spoken = read_integer_zh(hours) + "点"
    if int(minutes) == 0:
        return spoken
    return spoken + ("半" if int(minutes) == 30 else read_integer_zh(minutes) + "分")


def _read_temperature(match: re.Match) -> str:
    unit = "摄氏度" if match.group(3) == "摄氏度" else "度"
    return ("零下" if match.group(1) else "") + read_number(match.group(2)) + unit


def _read_quantity(match: re.Match) -> str:
    spoken = read_number(match.group(1))
    approximate = "多" if match.group(2) == "+" else match.group(2) or ""
    return ("两" if spoken == "二" else spoken) + approximate
