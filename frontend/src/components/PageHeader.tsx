import { useEffect, type ReactNode } from 'react'

interface Props {
  title: string
  description: ReactNode
  /** Buttons or links on the right of the heading. */
  actions?: ReactNode
}

/** The h1 of a page and its one-line purpose; also names the browser tab. */
export function PageHeader({ title, description, actions }: Props) {
  useEffect(() => {
    document.title = `${title} · Lanner`
  }, [title])

  return (
    <div className="page-header">
      <div>
        <h1>{title}</h1>
        <p className="page-header__description">{description}</p>
      </div>
      {actions && <div className="page-header__actions">{actions}</div>}
    </div>
  )
}
