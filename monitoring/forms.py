"""Page forms of monitoring: the node page's actions."""

from __future__ import annotations

from django import forms

from engine.states import NODE_ACTIONS

# how long running work may keep running on a draining node before it is moved, as offered on the
# node page (the API takes any number of seconds up to 30 days)
DRAIN_GRACE_CHOICES = [(0, "move work now"), (3600, "1 h"), (4 * 3600, "4 h"), (24 * 3600, "24 h")]


class NodeActionForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in NODE_ACTIONS])
    reason = forms.CharField(max_length=200, required=False)
    grace_s = forms.TypedChoiceField(choices=DRAIN_GRACE_CHOICES, coerce=int, required=False, empty_value=0)
