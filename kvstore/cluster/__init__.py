"""A cluster of walkv nodes: one writer elected and fenced through etcd, the
others its synchronous replicas, and failover with nobody at the keyboard.

:mod:`kvstore.cluster.node` (a node's roles), :mod:`kvstore.cluster.election`
(etcd: the leader key, the epoch, who may ask), :mod:`kvstore.cluster.follower`
(copying the leader's log), :mod:`kvstore.cluster.bootstrap` (a node built
from its leader's snapshot), :mod:`kvstore.cluster.etcd` (etcd's JSON
gateway). ``walkv serve --cluster`` serves a node: :mod:`kvstore.server.cluster`.
"""
