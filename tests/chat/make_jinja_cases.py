#!/usr/bin/env python3
"""Writes jinja_cases.json: what Jinja2 itself renders for each snippet below.

The snippets exercise the Jinja features chat templates use (whitespace
control, scoping, loops, macros, filters, tests, string methods, Python
printing of values, error cases). test_jinja_corpus.cpp renders each one with
m40-llm's interpreter and compares byte for byte; for snippets where Jinja2
raises, m40-llm must fail too (the Python message is kept for reference).

The environment is set up as Hugging Face transformers sets up chat templates:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]), tojson = json.dumps(ensure_ascii=False, ...),
raise_exception, strftime_now at 2024-07-26 00:00. Variables: messages (empty
unless the snippet gives some), tools=None, documents=None,
add_generation_prompt=True, bos_token='<s>', eos_token='</s>', plus the
snippet's own.

Run with Jinja2 3.1.x:  python3 tests/chat/make_jinja_cases.py
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime(2024, 7, 26).strftime(format)


ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now

BASE = dict(messages=[], tools=None, documents=None, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")

SNIPPETS = [
    ('{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 * 2 }}', {}),
    ('{{ 1e16 }} {{ 0.1 }} {{ 1/3 }} {{ 1e15 }} {{ -0.0 }} {{ 0.00001 }} {{ 123.456e-10 }} {{ 1.0 }} {{ 100.0 }}', {}),
    ("{{ true + 1 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ 'ab' * 0 }} {{ (1, 2) + (3,) }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ [1, 'x'] ~ {'k': none} }}", {}),
    ('{{ none }}|{{ true }}|{{ false }}|{{ undefined_var }}|{{ [] }}|{{ {} }}|{{ (1,) }}|{{ () }}', {}),
    ('{{ "it\'s" }} {{ [\'it\\\'s\', "a\\"b", \'x\\ny\', \'tab\\t\', \'ü\', \'\\x01\'] }}', {}),
    ('{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}', {}),
    ("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a','b') }}-{{ loop.depth }};{% endfor %}", {}),
    ('{% for x in [1,1,2] %}{{ loop.changed(x) }}{% endfor %}', {}),
    ("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", {}),
    ("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", {}),
    ("{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ('{% for x in [] %}a{% else %}empty{% endfor %}', {}),
    ('{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}', {}),
    ('{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}', {}),
    ('{% set x = 0 %}{% for i in [1,2,3] %}{{ x }}{% set x = i %}{% endfor %}{{ x }}', {}),
    ('{% for i in [1,2,3] %}{% if loop.first %}{% set y = 1 %}{% endif %}{{ y }}{% endfor %}', {}),
    ("{% set ns = namespace(a=1, b='x') %}{% for i in [1,2,3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns.c }}", {}),
    ('{% set ns = namespace() %}{% set ns.x = 5 %}{{ ns.x }}{{ ns }}', {}),
    ('{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}', {}),
    ('{% set x %}ab {{ 1 }}{% endset %}[{{ x }}]', {}),
    ("{% set x | upper | replace('A', 'z') %}ab{% endset %}{{ x }}", {}),
    ('{% macro m(a, b=2, c=a) %}{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4, 5, d=6) }}|{{ m(b=9, a=8) }}', {}),
    ('{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}', {}),
    ('{% macro m() %}<{{ caller(1) }}>{% endmacro %}{% call(x) m() %}c{{ x }}{% endcall %}', {}),
    ('{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}', {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    ('{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]', {}),
    ('{% for a in [[1,[2,3]]] %}{% for x, (y, z) in [a] %}{{x}}{{y}}{{z}}{% endfor %}{% endfor %}', {}),
    ("{{ 'abc'[::-1] }} {{ [1,2,3][-1:] }} {{ [1,2,3,4,5][1:4:2] }} {{ 'hello'[1:-1] }} {{ [1,2,3][::-2] }} {{ 'héllo'[1] }} {{ 'abc'[-1] }} {{ [1,2,3][5:] }} {{ 'x'[10:] }}", {}),
    ("{{ [1,2][5] }}|{{ none[1:] }}|{{ 'ab'.foo }}|{{ {'a':1}['b'] }}|{{ [1,2]['x'] }}", {}),
    ("{{ 'a' in 'cat' }} {{ 'x' in ['x'] }} {{ 'k' in {'k': 1} }} {{ 1 not in [1] }} {{ 'a' in undefined_var }}", {}),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1,2] == [1,2] }} {{ (1,2) == [1,2] }} {{ {'a':1} == {'a':1} }} {{ none == none }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }}", {}),
    ("{{ x is defined }} {{ none is none }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ x is iterable }} {{ none is sequence }}", {}),
    ("{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 1 is in [1, 2] }} {{ 2 is eq 2 }} {{ 2 is gt 1 }} {{ none is sameas none }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ x is undefined }} {{ range is callable }} {{ 1 is boolean }}", {}),
    ("{{ 'x' if true else 'y' }} {{ 'x' if false else 'y' }} [{{ 'x' if false }}] {{ 1 if none is none else 2 }}", {}),
    ("{{ none or 'd' }} {{ 0 and 'x' }} {{ 'a' and 'b' }} {{ [] or [] }} {{ not none }} {{ not 'x' }}", {}),
    ("{{ ' ab ' | trim }}|{{ 'xxabxx' | trim('x') }}|{{ '  a  '.strip() }}|{{ 'xya'.lstrip('xy') }}|{{ 'ayx'.rstrip('xy') }}|{{ '\xa0a\u2003'.strip() }}", {}),
    ("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.rsplit(' ', 1) }} {{ 'a b c'.split(' ', 1) }} {{ 'a</think>b'.split('</think>')[-1] }} {{ '  x  y '.rsplit(None, 1) }} {{ 'a\\nb\\r\\nc'.splitlines() }}", {}),
    ("{{ 'hello world'.startswith('hell') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.startswith('b', 1) }} {{ 'aXbX'.replace('X', '-') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.replace('', '-') }} {{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'abcabc'.rfind('b') }} {{ 'aaa'.count('a') }}", {}),
    ("{{ 'hello WORLD' | upper }} {{ 'HeLLo' | lower }} {{ 'hello world-foo(bar' | title }} {{ 'hello WORLD' | capitalize }} {{ 'hello world'.title() }} {{ 'grüße'.upper() }} {{ 'ÄÖÜ'.lower() }} {{ 'x1st y'.title() }}", {}),
    ("{{ [1,2,3] | length }} {{ 'héllo' | length }} {{ {'a':1} | length }} {{ x | length }} {{ [1,2,3] | count }}", {}),
    ("{{ [1,2,3] | join('-') }} {{ ['a','b'] | join }} {{ [{'n':'a'},{'n':'b'}] | join(',', attribute='n') }} {{ [1,none,'x'] | join(',') }}", {}),
    ("{{ [3,1,2] | first }} {{ [3,1,2] | last }} {{ 'abc' | first }} {{ [] | first }} {{ 'abc' | list }} {{ {'a':1,'b':2} | list }} {{ {'a':1} | items | list }} {{ x | items | list }}", {}),
    ("{{ [1,2,3] | reverse | list }} {{ 'abc' | reverse }} {{ [3,1,2] | sort }} {{ ['b','A','c'] | sort }} {{ ['b','A','c'] | sort(case_sensitive=true) }} {{ [3,1,2] | sort(reverse=true) }} {{ [{'a':2},{'a':1}] | sort(attribute='a') }}", {}),
    ("{{ [1,2,2,3,1] | unique | list }} {{ ['a','A','b'] | unique | list }} {{ [1,5,3] | max }} {{ [1,5,3] | min }} {{ [1,2,3] | sum }} {{ [{'v':1},{'v':2}] | sum(attribute='v') }} {{ [] | max }}", {}),
    ("{{ x | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }} {{ 0 | d('z', boolean=true) }} {{ 'v' | default('d') }}", {}),
    ("{{ [{'role':'user'},{'role':'assistant'},{'role':'user'}] | selectattr('role', 'equalto', 'user') | list | length }} {{ [1,2,3,4] | select('odd') | list }} {{ [1,2,3,4] | reject('odd') | list }} {{ [0,1,''] | select | list }} {{ ['code_interpreter','x'] | reject('equalto', 'code_interpreter') | join(', ') }}", {}),
    ("{{ [{'a':{'b':1}},{'a':{'b':2}}] | map(attribute='a.b') | list }} {{ ['a','b'] | map('upper') | list }} {{ [{'x':1},{}] | map(attribute='x', default=0) | list }} {{ [{'a':1},{'a':0}] | rejectattr('a') | list }} {{ [{'a':1},{'b':0}] | selectattr('a', 'defined') | list }}", {}),
    ("{{ '42' | int }} {{ '42.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1A' | int(0, 16) }} {{ '3.5' | float }} {{ 'x' | float }} {{ 2 | float }} {{ '1_000' | int }} {{ ' 12 ' | int }}", {}),
    ("{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ 5 | round }} {{ -3 | abs }} {{ -2.5 | abs }}", {}),
    ("{{ {'b':1,'a':2} | dictsort }} {{ {'b':1,'a':2} | dictsort(by='value') }} {{ {'b':1,'A':2} | dictsort(reverse=true) }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'x\\ny' | indent('>') }}", {}),
    ('{{ \'<a href="x">&\\\'\' | escape }} {{ \'x\' | safe }} {{ 1 | string }} {{ none | string }} {{ \'abc\' | center(9) }}|{{ \'one two  three\' | wordcount }} {{ \'hello world foo bar baz\' | truncate(9) }} {{ \'hello world foo bar baz\' | truncate(9, true) }} {{ \'hello\' | truncate(9) }}', {}),
    ("{{ [1,2,3,4,5] | batch(2) | list }} {{ [1,2,3] | batch(2, 'x') | list }} {{ 'abc' | attr('upper') is callable }} {{ {'a':1} | attr('a') }}", {}),
    ('{{ {\'a\': 1, \'b\': [1, 2.5, \'x\', none, true], \'c\': {\'d\': \'ü"\\\\\\n\'}} | tojson }}', {}),
    ("{{ {'a': 1, 'b': [1, {}, []], 'c': {'d': 'x'}} | tojson(indent=2) }}|{{ [1,2] | tojson(indent=0) }}|{{ {'b':1,'a':2} | tojson(sort_keys=true) }}|{{ [1,{'a':2}] | tojson(separators=(',', ':')) }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ '😀' | tojson(ensure_ascii=true) }}|{{ {1: 2, none: 3, true: 4} | tojson }}", {}),
    ("{{ 1e100 | tojson }} {{ 0.1 | tojson }} {{ (1, 2) | tojson }} {{ 'a\\u2028b\\x7f\\x1f' | tojson }}", {}),
    ("{{ '%s-%05.2f|%r|%d%%' % ('a', 3.14159, 'q', 7) }} {{ '%(a)s-%(b)d' % {'a': 1, 'b': 2} }} {{ '%5s|%-5s|%.2s|%x|%o|%e|%g|%c|%+d|% d|%#x|%05d' % ('ab','cd','xyz',255,8,12345.678,0.00001,65,5,5,255,-42) }} {{ '%s' % none }} {{ '%s %s' | format(1, 2) }} {{ '%d' % 3.9 }}", {}),
    ("{{ '{}-{:>5}-{name!r}'.format(1, 'ab', name='z') }} {{ '{0}{1}{0}'.format('a','b') }} {{ '{:^9}|{:<4}|{:>6.2f}|{:,}|{:x}|{:08.3f}|{:+}|{!r:>6}|{:e}|{:%}'.format('mid', 7, 3.14159, 1234567, 255, -3.5, 5, 's', 1234.5, 0.25) }} {{ '{a[b]}-{c[0]}'.format(a={'b':1}, c=[9]) }} {{ '{{}}{}'.format(1) }} {{ '{:5}|{:5}|{}'.format(1.5, 'x', 1e20) }}", {}),
    ("{{ range(5) | list }} {{ range(2, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }}", {}),
    ("{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner('|') %}{% for x in [1,2,3] %}{{ j() }}{{ x }}{% endfor %}", {}),
    ("{{ {'a':1}.get('a') }} {{ {'a':1}.get('b') }} {{ {'a':1}.get('b', 5) }} {{ {'a':1,'b':2}.keys() | list }} {{ {'a':1,'b':2}.values() | list }} {{ {'a':1}.items() | list }}", {}),
    ("{{ [1,2,3].index(2) }} {{ [1,1,2].count(1) }} {{ 'a-b'.partition('-') }} {{ 'abc'.removeprefix('a') }} {{ '5'.zfill(3) }} {{ 'ab'.ljust(4, '*') }}| {{ 'ab'.rjust(4) }} {{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' '.isspace() }} {{ 'ABC'.isupper() }} {{ 'x'.center(4, '-') }} {{ 'ab'.center(5) }}|", {}),
    ("{{ ', '.join(['a', 'b']) }} {{ 'x'.join('abc') }}", {}),
    ('a\n  {% if true %}\n  b\n  {% endif %}\nc\n', {}),
    ('a  {%- if true -%}  b  {%- endif -%}  c', {}),
    ("x {{- ' y ' -}} z\n{{ 'w' }}  \n", {}),
    ('  {# comment #}\nline\n  {#- c -#}  tail', {}),
    ('{% raw %}{{ not a var }}{% endraw %} {%- raw -%}  x  {%- endraw -%} y', {}),
    ('a\n    {%+ if true %}b{% endif %}\n', {}),
    ("{{ 'a' }}\n{% if true %}\n  x\n{% endif %}\n", {}),
    ('   {% for i in [1,2] %}\n   {{ i }}\n   {% endfor %}\n   done', {}),
    ('{{ \'multi\nline\' }} {{ "a" "b" \'c\' }}', {}),
    ("{{ {'a': {'b': {'c': 1}}}['a']['b'].c }} {{ [[1, 2], [3]][0][1] }} {{ [1,2].0 }}", {}),
    ('{{ -x|abs }}', {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 'a' + none }}", {}),
    ('{{ none + 1 }}', {}),
    ('{{ [1] + (2,) }}', {}),
    ('{{ 1 / 0 }}', {}),
    ('{{ 1 // 0 }}', {}),
    ('{{ 1 % 0 }}', {}),
    ('{{ x + 1 }}', {}),
    ('{{ x.y }}', {}),
    ('{{ x() }}', {}),
    ('{{ x[0] }}', {}),
    ('{% for i in none %}{% endfor %}', {}),
    ('{% for i in 5 %}{% endfor %}', {}),
    ('{{ 1 in none }}', {}),
    ("{{ 1 in 'abc' }}", {}),
    ("{{ {'a':1}.pop('a') }}", {}),
    ('{{ [1].append(2) }}', {}),
    ("{{ 'a' < 1 }}", {}),
    ('{{ none | length }}', {}),
    ('{{ 5 | length }}', {}),
    ('{{ x | tojson }}', {}),
    ("{{ raise_exception('boom ' ~ 1) }}", {}),
    ('{% set a, b = [1, 2, 3] %}', {}),
    ('{% set a, b = [1] %}', {}),
    ('{% set x = 1 %}{% set x.y = 2 %}', {}),
    ("{{ 'abc'.split('') }}", {}),
    ('{{ [1,2,3][::0] }}', {}),
    ('{{ range(200000) | length }}', {}),
    ("{{ strftime_now('%d %b %Y') }} {{ strftime_now('%B %d, %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S %A %j %%') }} [{{ strftime_now('%z%Z') }}]", {}),
    ("{{ messages[0].content }} {{ messages[0]['role'] }} {{ messages | length }} {{ messages[-1].missing is defined }}", {'messages': [{'role': 'user', 'content': 'hi'}]}),
    ('{{ enable_thinking }} {{ n + 1 }} {{ obj.k }} {{ lst[1] }}', {'enable_thinking': False, 'n': 41, 'obj': {'k': 'v'}, 'lst': [1, 2.5]}),
    ("{{ (1, 2)[0] }} {{ (1) }} {{ () | length }} {{ [1,2,][1] }} {{ {'a':1,}['a'] }}", {}),
    ("{{ [] is sequence }} {{ {} is sequence }} {{ 'x' is sequence }} {{ 1 is sequence }}", {}),
    ('{% if 1 %}a{% elif 2 %}b{% else %}c{% endif %}{% if 0 %}a{% elif 2 %}b{% else %}c{% endif %}{% if 0 %}a{% elif 0 %}b{% else %}c{% endif %}', {}),
    ("{% for item in [{'c': [{'c': []}, {'c': [{'c': []}]}]}] recursive %}[{{ loop.depth }}{{ loop(item.c) }}]{% endfor %}", {}),
    ('{% set x = [1,2,3] %}{% set y = x[1:] %}{{ x }}{{ y }}{% set x = x + [4] %}{{ x }}{{ y }}', {}),
    ("{{ 'abc' ~ 5 | string }} {{ 1 ~ 2 + 3 }} {{ 2 * 3 ~ 4 }} {{ - 2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 10 - 2 - 3 }} {{ not 1 == 2 }} {{ 'ab' + 'cd' | upper }}", {}),
    ('{% set messages = messages + [1] %}{{ messages }}', {}),
    ("{{ namespace(a=1).a }} {{ namespace({'b': 2}).b }}", {}),
    ("{{ 'x'|e }}{{ '<'|forceescape }}", {}),
    ('{% if %}', {}),
    ('{% if x %}', {}),
    ('{% for x in %}{% endfor %}', {}),
    ('{% endif %}', {}),
    ('{% if true %}{% endfor %}', {}),
    ('{{ 1 + }}', {}),
    ('{{ a b }}', {}),
    ('{% foo %}', {}),
    ('{{ x | nosuchfilter }}', {}),
    ('{{ x is nosuchtest }}', {}),
    ("{{ 'unterminated }}", {}),
    ('{{ (1 }}', {}),
    ('{{ 1) }}', {}),
    ('{{ [1 }}', {}),
    ('{# unterminated comment', {}),
    ('{% raw %} no end', {}),
    ('{% break %}', {}),
    ('{% macro m(a=1, b) %}{% endmacro %}', {}),
    ('{{ x ! y }}', {}),
    ('{% set 1 = 2 %}', {}),
    ("{% include 'x' %}", {}),
    ('{{ }}', {}),
    ('{% for x in [1] %}{% else %}{% else %}{% endfor %}', {}),
    ("{{ {'a': 1 }}", {}),
    ('\n\n  {{ 1 +* 2 }}', {}),
    ('{%- if true -%}\n\t  x  \n{%- endif -%}', {}),
    ('{% if true %}  \n x{% endif %}', {}),
    ('{% if true %}\r\n x\r\n{% endif %}\r\n', {}),
    ('text\n', {}),
    ('text\n\n', {}),
    ('text\r\n', {}),
    ("{{ 'a' }}\n", {}),
    ('{% if true %}x{% endif %}\n\n', {}),
    ('\t{% if true %}\n\tx\n\t{% endif %}\n', {}),
    ('x {% if true %}\ny{% endif %}', {}),
    ("  {{ 'v' }}\n  {% if true %}w{% endif %}", {}),
    ('{%- for i in [1,2] %}\n  {{- i }}\n{%- endfor %}', {}),
    ('{% for i in [1, 2] -%}\n  {{ i }}\n{% endfor %}', {}),
    ('a {#- c #} b {# c -#} c {#+ c +#}\n d', {}),
    ('{%+ if true +%}\nx\n  {%+ endif %}', {}),
    ("{{- '  a  ' -}}", {}),
    ('  \n  {%- if true %}\nx{% endif %}', {}),
    ('{% if true %}{% if true %}\n  inner\n  {% endif %}\n{% endif %}', {}),
    ("{% set x = 'a' %}{{ x\n}}{{\nx }}", {}),
    ("{{ 'a' ~\n 'b' }}", {}),
    ("{% if 'x' in 'xyz'\n %}yes{% endif %}", {}),
    ("{{ '\\u00e9\\U0001F600\\x41\\101\\q\\\\' }}", {}),
    ('{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1.5e3 }} {{ 1E2 }} {{ 00 }}', {}),
    ("{{ 'a' if 'b' }}", {}),
    ("{% set d = {'k': 1, 'k': 2} %}{{ d }}", {}),
    ("{{ [1, 2, 3] | map('string') | join }}", {}),
    ('{% macro m() %}{{ varargs | length }}{{ kwargs }}{% endmacro %}{{ m(1, 2, x=3) }}', {}),
    ('{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}', {}),
    ('{% for i in [1] %}{% macro m() %}{{ i }}{% endmacro %}{% endfor %}{{ m is defined }}', {}),
    ('{% set out = [] %}{% for i in range(3) %}{% set out = out + [i] %}{% endfor %}{{ out }}', {}),
    ('{% for x in [1] %}{% for x in [2] %}{{ x }}{% endfor %}{{ x }}{% endfor %}', {}),
    ('{% for x in [1,2] %}{{ loop.index }}{% for y in [1] %}{{ loop.index }}{% endfor %}{% endfor %}', {}),
    ('{{ undefined_var.attr is defined }}', {}),
    ("{{ 'abc' is string and 'abc' is not number }}", {}),
    ('{{ 1 if 2 > 1 else 3 if 4 else 5 }}', {}),
    ('{{ not true is false }}', {}),
    ('{{ 5 - -3 }} {{ --3 }} {{ +3 }}', {}),
    ('{{ [1, 2] | first | string }}', {}),
    ("{{ messages | selectattr('role', 'equalto', 'user') | list }}", {}),
    ("{{ 3 is gt 2 }} {{ 'a' is lessthan 'b' }} {{ 2 is ne 3 }} {{ 1 is le 1 }} {{ 2 is ge 3 }} {{ x is eq none }}", {}),
    ("{% set x = {'role': 'user'} %}{{ x.role }} {{ x['role'] }} {{ x.get('role') }} {{ x.keys() | list }} {{ x.items() | list }}", {}),
    ("{{ 'a' * 3 + 'b' }}", {}),
    ("{{ [1, 2, 3] | select('gt', 1) | list }} {{ [1, 2, 3] | select('in', [1, 3]) | list }}", {}),
    ('{{ 1.0 == 1 }} {{ 0.1 + 0.2 }} {{ 3.0 * 2 }} {{ 10 / 4 }} {{ 2 ** 0.5 }} {{ 1e300 * 1e10 }} {{ -1e300 * 1e10 }}', {}),
    ('{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 7 % -3 }} {{ -7 // -2 }}', {}),
    ("{% set t = (1, 'a') %}{{ t[1] }}{{ t | length }}{{ t is sequence }}", {}),
    ('{{ (1,2,3)[1:] }} {{ (1,)[0] }}', {}),
    ('{%- set x -%}\n  body  \n{%- endset -%}[{{ x }}]', {}),
    ("{{ 'a' in ['a'] in [True] }}", {}),
    # Case mapping beyond Latin, Greek and Cyrillic: Georgian (Asomtavruli,
    # Nuskhuri, Mtavruli, Mkhedruli), Cherokee, Deseret, Glagolitic,
    # fullwidth Latin, Armenian, Adlam, Old Hungarian.
    ("{{ 'ⴀ' | upper }} {{ 'Ⴀ' | lower }} {{ 'Ა' | lower }} {{ 'ა'.upper() }} {{ 'ꭰ' | upper }} {{ 'Ꭰ' | lower }} {{ '𐐨' | upper }} {{ '𐐀' | lower }} {{ 'ⰰ' | upper }} {{ 'Ⰰ' | lower }} {{ 'ａｂ' | upper }} {{ 'ＡＢ' | lower }} {{ 'աբ' | upper }} {{ 'ԱԲ' | lower }} {{ '𞤢' | upper }} {{ '𐲀' | lower }}", {}),
    # Full mappings (SpecialCasing), casefold, the final sigma of lower().
    ("{{ 'ß'.upper() }} {{ 'ﬀ'.upper() }} {{ 'ΐ'.upper() }} {{ 'İ'.lower() | length }} {{ 'ß'.casefold() }} {{ 'ꭰ'.casefold() }} {{ 'ΣΊΣΥΦΟΣ ΟΔΟΣ. Σ'.lower() }} {{ 'ΑΣ\u0301'.lower() }} {{ 'ΑΣ\u0301Α'.lower() }} {{ 'ΟΔΟΣ' | lower }}", {}),
    ("{{ 'ǆemal ßtraße ΟΔΟΣ'.title() }} {{ 'ǆemal'.capitalize() }} {{ 'ǅ'.swapcase() }} {{ 'ΑΣ'.swapcase() }} {{ 'ǅemal'.istitle() }} {{ 'Ⴀⴀ'.istitle() }} {{ 'ǆ' | title }} {{ 'ßa-ǆb ΟΔΟΣ' | title }} {{ 'ǆemal' | capitalize }}", {}),
    ("{{ 'ǅ'.isupper() }} {{ 'ǅ'.islower() }} {{ 'Ꭰ'.isupper() }} {{ 'ꭰ'.islower() }} {{ 'ª'.islower() }} {{ 'ʰ'.islower() }} {{ 'Ⅻ'.isupper() }} {{ '٣'.isdigit() }} {{ '²'.isdigit() }} {{ '²'.isdecimal() }} {{ '½'.isnumeric() }} {{ '½'.isdigit() }} {{ 'ა'.isalpha() }} {{ '日本'.isalpha() }} {{ 'a½'.isalnum() }} {{ '🌍'.isalpha() }} {{ 'héllo wörld 日本語 🌍 a_b ½' | wordcount }}", {}),
]


def main():
    cases = []
    for template, variables in SNIPPETS:
        case = {"template": template, "variables": variables}
        kwargs = dict(BASE)
        kwargs.update(variables)
        try:
            case["expected"] = ENV.from_string(template).render(**kwargs)
        except Exception as e:  # noqa: BLE001 - any failure is an expected failure
            case["error"] = "%s: %s" % (type(e).__name__, e)
        cases.append(case)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jinja_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "make_jinja_cases.py with Jinja2 " + jinja2.__version__, "cases": cases}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), path))


if __name__ == "__main__":
    main()
