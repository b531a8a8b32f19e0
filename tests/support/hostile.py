"""A model and a text that every layer must carry through unchanged: empty and nested
containers, integers past 2**53, a float, astral and right-to-left characters, a NUL, a
zero-width joiner, quotes, a backslash and a tab."""

HOSTILE_MODEL = {
    "a": [],
    "b": {},
    "nested": [[1, [2, []]], {"x": [{}]}],
    "big": 12345678901234567,
    "neg": -98765432109876543,
    "float": 0.1,
    "emoji": "𝄞😀",
    "slash": "a/b",
}


HOSTILE_TEXT = 'nul\x00 rtl\u202eabc\u202c zwj 👩\u200d👩\u200d👧 astral 𝄞 quote" back\\ tab\t'
