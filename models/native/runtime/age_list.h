/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An age list: entries linked from oldest to newest through their `older`
 * and `newer` pointers, its ends in the `oldest` and `newest` pointers of
 * an owner.  The host keeps its cached folios on one (insertion order: the
 * fallback evicts the oldest) and every LRU hash map its elements (use
 * order: a full map drops the oldest).  The entries' types differ, so the
 * operations are macros over any owner and entry with those fields; they
 * evaluate their arguments more than once, so pass none with side effects.
 */
#ifndef CP_AGE_LIST_H
#define CP_AGE_LIST_H

/* Take e off owner's list (e's own links are left as they were). */
#define CP_AGE_UNLINK(owner, e)						\
	do {								\
		if ((e)->older)						\
			(e)->older->newer = (e)->newer;			\
		else							\
			(owner)->oldest = (e)->newer;			\
		if ((e)->newer)						\
			(e)->newer->older = (e)->older;			\
		else							\
			(owner)->newest = (e)->older;			\
	} while (0)

/* Put e at the newest end of owner's list. */
#define CP_AGE_PUSH(owner, e)						\
	do {								\
		(e)->newer = NULL;					\
		(e)->older = (owner)->newest;				\
		if ((owner)->newest)					\
			(owner)->newest->newer = (e);			\
		else							\
			(owner)->oldest = (e);				\
		(owner)->newest = (e);					\
	} while (0)

#endif /* CP_AGE_LIST_H */
