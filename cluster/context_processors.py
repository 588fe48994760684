from cluster.roles import is_operator, role_name


def roles(request):
    user = getattr(request, "user", None)
    return {"is_operator": is_operator(user), "role": role_name(user) if user else "none"}
