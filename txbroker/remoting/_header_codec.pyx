# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of the header decoders that ``header_codec.py`` generates per header class.

``header_codec._compile_decoder`` turns a class's field declarations into straight-line Python
(one read, check and conversion per field); when this module was built (and
``TXBROKER_NO_EXTENSIONS`` is not set) it builds a :class:`Decoder` from the same plan instead,
which runs the same steps in C.  The accepted values take the fast path here; every refusal is
worded by the reference's own functions (``_absent`` and the per-field converters), so both
raise the same ``HeaderError`` with the same remark, which tests/test_extensions.py checks on
random extFields.
"""

cdef enum Kind:
    PLAIN = 0       # a string taken as it is
    INTEGER = 1     # int32 / int64 with a range
    BOOLEAN = 2     # true/false/1/0
    CONVERTED = 3   # a string with allowed values: the converter decides


cdef class _Step:
    cdef str attr
    cdef object wire
    cdef object fallback
    cdef object convert
    cdef int kind
    cdef bint required
    cdef bint allow_empty
    cdef object name
    cdef object default
    cdef object lo
    cdef object hi


cdef class Decoder:
    """``ext -> header`` for one class (and key map): the steps of the generated decoder."""

    cdef object cls
    cdef object absent
    cdef dict bools
    cdef tuple steps

    def __init__(self, cls, absent, bools, steps):
        """``steps``: per field (attribute, wire key, fallback key or None, converter or None,
        kind "str"/"int"/"long"/"bool", required, allow_empty, name, default, lo, hi)."""
        self.cls = cls
        self.absent = absent
        self.bools = bools
        out = []
        for attr, wire, fallback, convert, kind, required, allow_empty, name, default, lo, hi in steps:
            step = _Step()
            step.attr, step.wire, step.fallback, step.convert = attr, wire, fallback, convert
            if convert is None:
                step.kind = PLAIN
            elif kind in ("int", "long"):
                step.kind = INTEGER
            elif kind == "bool":
                step.kind = BOOLEAN
            else:
                step.kind = CONVERTED
            step.required, step.allow_empty, step.name = required, allow_empty, name
            step.default, step.lo, step.hi = default, lo, hi
            out.append(step)
        self.steps = tuple(out)

    def __call__(self, ext):
        cdef dict kwargs = {}
        cdef _Step step
        cdef bint exact = type(ext) is dict
        get = None if exact else ext.get
        for step in self.steps:
            raw = (<dict>ext).get(step.wire) if exact else get(step.wire)
            if raw is None and step.fallback is not None:
                raw = (<dict>ext).get(step.fallback) if exact else get(step.fallback)
            if raw is None or (not step.allow_empty and raw == ""):
                if step.required:
                    self.absent(self.cls, raw, step.name)
                value = step.default
            elif step.kind == PLAIN:
                value = raw
            elif step.kind == INTEGER:
                value = int(raw) if raw.isdecimal() else step.convert(raw)
                if not step.lo <= value <= step.hi:
                    step.convert(raw)
            elif step.kind == BOOLEAN:
                value = self.bools.get(raw)
                if value is None:
                    value = step.convert(raw)
            else:
                value = step.convert(raw)
            kwargs[step.attr] = value
        return self.cls(**kwargs)
