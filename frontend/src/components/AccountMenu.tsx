import { useEffect, useId, useRef, useState } from 'react'
import { Link } from 'react-router'
import { useAuth } from '../auth'

/** The signed-in user's name in the header; opens a menu with API tokens, notifications and sign-out. */
export function AccountMenu() {
  const { user, signOut } = useAuth()
  const [open, setOpen] = useState(false)
  const menuId = useId()
  const ref = useRef<HTMLDivElement>(null)

  useEffect(() => {
    if (!open) return
    function onPointer(event: PointerEvent) {
      if (ref.current && !ref.current.contains(event.target as Node)) setOpen(false)
    }
    function onKey(event: KeyboardEvent) {
      if (event.key === 'Escape') setOpen(false)
    }
    document.addEventListener('pointerdown', onPointer)
    document.addEventListener('keydown', onKey)
    return () => {
      document.removeEventListener('pointerdown', onPointer)
      document.removeEventListener('keydown', onKey)
    }
  }, [open])

  if (!user) return null
  return (
    <div className="account" ref={ref}>
      <button
        type="button"
        className="account__button"
        aria-haspopup="true"
        aria-expanded={open}
        aria-controls={menuId}
        onClick={() => setOpen((o) => !o)}
      >
        <span className="account__avatar" aria-hidden="true">
          {user.display_name.slice(0, 1).toUpperCase()}
        </span>
        {user.display_name}
        <span aria-hidden="true">▾</span>
      </button>
      {open && (
        <div className="account__menu" id={menuId}>
          <p className="account__who">
            <span className="mono small">{user.email}</span>
            <span className="badge">{user.role}</span>
          </p>
          <Link to="/account/tokens" className="account__item" onClick={() => setOpen(false)}>
            API tokens
          </Link>
          <Link to="/account/notifications" className="account__item" onClick={() => setOpen(false)}>
            Notifications
          </Link>
          <button
            type="button"
            className="account__item"
            onClick={() => {
              setOpen(false)
              void signOut()
            }}
          >
            Sign out
          </button>
        </div>
      )}
    </div>
  )
}
